"""Moving a single-tag ledger into cells (``toolq cells migrate``, docs/cells.md).

A ledger written before cells keeps every key under one tag (``{toolq}:op:<ref>``,
``{toolq}:due``, ...). This moves it, on the one server it lives on, into the
layout of ``cells`` cells (``{toolq:c042}:op:<ref>``, ...), so that processes
started with ``TOOLQ_CELLS`` find every operation where :func:`toolq.core.cells.cell_of`
says. Then the server can become a Cluster node (docs/cells.md, step 7).

Run it with every writer stopped (workers, schedulers, relays, clients): it
refuses while one beats, and while the outbox holds messages (let the relay
publish them first). What moves:

- each record: ``RENAME`` to its cell's key (its TTL goes with it);
- the due set and every state index: each member to its cell's set, score kept;
- the counters and the set of tools: into cell 0's (the views sum counters and
  unite tools over the cells, so the totals stay right);
- the scheduler's wake list and planned wake-up, and the empty outbox: deleted
  (each cell has its own, made on first use).

Deployment-wide keys (schedulers', workers' and relays' beats, the chart's
series) stay where they are. The number of cells is recorded in the meta last:
an interrupted run is run again and finishes (every step above is idempotent).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from toolq.adapters.ledger.stored_format import format_checked
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.core.layout import Cells, Layout, SingleTag
from toolq.core.text import as_text

#: Keys read or moved per round trip.
CHUNK = 1000
#: A process whose beat is this recent (ms) counts as running.
ALIVE_MS = 15_000


@dataclass
class Moved:
    """What a migration moved (``toolq cells migrate`` prints it)."""

    cells: int
    records: int = 0
    due: int = 0
    indexes: int = 0
    indexed: int = 0
    counters: int = 0
    tools: int = 0
    already: bool = False


def to_cells(
    client: redis.Redis, prefix: str, cells: int, now_ms: int, *, force: bool = False
) -> Moved:
    """Move the single-tag ledger ``prefix`` on ``client``'s server into ``cells`` cells.

    errors.RequestRefused when it cannot be done safely: a Cluster client (migrate
    on the single server first), another number of cells recorded, a writer still
    beating (unless ``force``), messages in the outbox; errors.LedgerFormat for a
    ledger of another format (``toolq migrate`` first).
    """
    new = Cells(prefix, cells)  # checks the number
    if isinstance(client, RedisCluster):
        raise errors.RequestRefused(
            "migrate on the single server the ledger lives on, before it joins a Cluster"
        )
    old = SingleTag(prefix).root
    # a ledger of an earlier format is brought to today's first (`toolq migrate`)
    format_checked(client, prefix, client.hget(old.meta, "format"))
    recorded = client.hget(old.meta, "cells")
    if recorded is not None:
        why = new.conflict(recorded)
        if why is not None:
            raise errors.RequestRefused(why)
        return Moved(cells, already=True)
    if not force:
        running = running_writers(client, old, now_ms)
        if running:
            raise errors.RequestRefused(
                "stop every worker, scheduler and relay first (still beating: "
                + ", ".join(running[:5])
                + "); --force if they are gone without a goodbye"
            )
    if client.xlen(old.outbox):
        raise errors.RequestRefused(
            "the outbox still holds messages: let a relay publish them, then stop it"
        )
    moved = Moved(cells)
    moved.records = _records(client, old, new)
    moved.due = _split(client, old.due, new, lambda k: k.due)
    for key in list(client.scan_iter(match=_glob(old.index_prefix) + "*", count=CHUNK)):
        name = as_text(key)
        moved.indexes += 1
        moved.indexed += _split(client, name, new, _index_in(name[len(old.index_prefix) :]))
    moved.counters, moved.tools = _into_cell_zero(client, old, new.every_cell()[0])
    client.delete(old.wake, old.sleep_until, old.outbox)
    client.hset(old.meta, "cells", cells)
    return moved


def running_writers(client: redis.Redis, keys: Keys, now_ms: int) -> list[str]:
    """Schedulers, worker nodes and relays whose last beat is recent."""
    found = []
    for sid, beat in client.hgetall(keys.schedulers).items():
        if now_ms - int(float(beat)) <= ALIVE_MS:
            found.append(f"scheduler {as_text(sid)}")
    for queue, beat in client.hgetall(keys.workers).items():
        if now_ms - int(float(beat)) <= ALIVE_MS:
            found.append(f"a worker on {as_text(queue)}")
    for rid, raw in client.hgetall(keys.relays).items():
        if _beat_at(raw) >= now_ms - ALIVE_MS:
            found.append(f"relay {as_text(rid)}")
    return found


def _records(client: redis.Redis, old: Keys, new: Layout) -> int:
    moved = 0
    batch: list[str] = []

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for name in batch:
            ref = name[len(old.op_prefix) :]
            pipe.rename(name, new.keys_of(ref).op(ref))
        pipe.execute()
        batch.clear()

    # Renamed keys leave the pattern; a SCAN may still return a key twice: read first.
    for key in list(client.scan_iter(match=_glob(old.op_prefix) + "*", count=CHUNK)):
        batch.append(as_text(key))
        moved += 1
        if len(batch) >= CHUNK:
            flush()
    if batch:
        flush()
    return moved


def _split(client: redis.Redis, key: str, new: Layout, name: Callable[[Keys], str]) -> int:
    """Every member of the sorted set ``key`` into the set ``name(Keys of its cell)``,
    score kept; then ``key`` deleted. Returns how many members moved."""
    moved = 0
    chunk: dict[str, dict[str, float]] = defaultdict(dict)

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for target, members in chunk.items():
            pipe.zadd(target, members)
        pipe.execute()
        chunk.clear()

    for member, score in client.zscan_iter(key, count=CHUNK):
        ref = as_text(member)
        chunk[name(new.keys_of(ref))][ref] = score
        moved += 1
        if moved % CHUNK == 0:
            flush()
    if chunk:
        flush()
    client.delete(key)
    return moved


def _index_in(suffix: str) -> Callable[[Keys], str]:
    """The index ``<tool>:<state>`` (``suffix``) among a cell's keys."""
    return lambda keys: keys.index_prefix + suffix


def _into_cell_zero(client: redis.Redis, old: Keys, zero: Keys) -> tuple[int, int]:
    """The counters added into cell 0's and the tools united with its set, and the old
    keys deleted, in one transaction (a second run finds nothing to add twice)."""
    stats = client.hgetall(old.stats)
    tools = client.scard(old.tools)
    pipe = client.pipeline(transaction=True)
    for field, value in stats.items():
        pipe.hincrby(zero.stats, as_text(field), int(value))
    pipe.sunionstore(zero.tools, [zero.tools, old.tools])
    pipe.delete(old.stats, old.tools)
    pipe.execute()
    return len(stats), int(tools)


def _beat_at(raw: Any) -> int:
    try:
        return int(json.loads(raw)["at"])
    except (ValueError, KeyError, TypeError):
        return 0


def _glob(text: str) -> str:
    """``text`` as a literal SCAN pattern (a tag may hold ``[`` or ``*``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
