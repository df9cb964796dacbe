"""``toolq migrate``: a ledger of an earlier format brought to today's, step by step
(:data:`toolq.decisions.formats.STEPS`; the check every process makes is
:mod:`toolq.adapters.ledger.stored_format`). Each step is idempotent and each key's move
is atomic (``RENAMENX``; histories folded into their records and the lists deleted, a
batch per ``MULTI``), and the format is recorded last: an interrupted run leaves a
ledger that processes still refuse, and a second run finishes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from toolq.adapters.ledger.migrate import ALIVE_MS, running_writers
from toolq.adapters.ledger.stored_format import CHUNK, detect, glob, recorded, refuse, v1_pattern
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.core.text import as_text
from toolq.decisions import formats
from toolq.decisions.formats import FORMAT, FORMAT_FIELD

#: Called with one line of progress (``click.echo`` from the CLI).
Progress = Callable[[str], None]
#: Print progress every so many keys on long work.
EVERY = 10_000
#: Histories folded per transaction (two round trips each).
FOLD_BATCH = 500


# ---------------------------------------------------------------------- migrate


@dataclass
class Migration:
    """What ``toolq migrate`` found and did (or, dry, would do)."""

    prefix: str
    found: int
    dry_run: bool
    steps: list[formats.Step] = field(default_factory=list)
    renamed: int = 0
    deleted: int = 0
    histories: int = 0
    entries: int = 0
    stamped: bool = False

    @property
    def already(self) -> bool:
        return self.found == FORMAT and not self.steps and not self.stamped


def migrate(
    client: redis.Redis,
    prefix: str,
    *,
    dry_run: bool = False,
    force: bool = False,
    progress: Progress = lambda _line: None,
    now_ms: int | None = None,
) -> Migration:
    """Bring the ledger ``prefix`` to today's format (see the module's docstring).

    errors.LedgerFormat for a newer format; errors.RequestRefused while a worker,
    scheduler or relay beats on the ledger (unless ``force``) or on a Cluster client.
    """
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        raise errors.RequestRefused(
            "earlier formats never ran on a Cluster: nothing there to migrate"
        )
    keys = Keys(prefix)
    was = recorded(prefix, client.hget(keys.meta, FORMAT_FIELD))
    found = was if was is not None else detect(client, prefix)
    if found > FORMAT:
        refuse(prefix, found)
    plan = Migration(prefix, found, dry_run, formats.steps(found))
    if not plan.steps and was == FORMAT:
        return plan
    if not force:
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        running = running_writers(client, keys, now) + _v1_schedulers(client, prefix, now)
        if running:
            raise errors.RequestRefused(
                "stop every worker, scheduler and relay on this ledger first (still "
                "beating: " + ", ".join(running[:5]) + "); --force if they are gone "
                "without a goodbye"
            )
    for step in plan.steps:
        progress(f"step {step.source} -> {step.source + 1}: " + step.what.format(prefix=prefix))
        STEP_RUNNERS[step.source](client, plan, progress)
    if not dry_run:
        # last: an interrupted run leaves the ledger refused, and a re-run finishes it
        client.hset(keys.meta, FORMAT_FIELD, FORMAT)
    plan.stamped = was != FORMAT
    return plan


def _v1_schedulers(client: redis.Redis, prefix: str, now_ms: int) -> list[str]:
    found = []
    for sid, beat in client.hgetall(prefix + ":schedulers").items():
        if now_ms - int(float(beat)) <= ALIVE_MS:
            found.append(f"scheduler {as_text(sid)}")
    return found


def _step_1(client: redis.Redis, plan: Migration, progress: Progress) -> None:
    """Every format-1 key renamed to its tagged name (or deleted: the transient ones)."""
    prefix = plan.prefix
    names = [
        as_text(k)
        for k in client.scan_iter(match=v1_pattern(prefix), count=CHUNK)
        if formats.is_v1_key(prefix, as_text(k))
    ]
    names = sorted(set(names))  # a SCAN may return a key twice
    for start in range(0, len(names), CHUNK):
        batch = names[start : start + CHUNK]
        targets = [formats.v1_target(prefix, n) for n in batch]
        if not plan.dry_run:
            pipe = client.pipeline(transaction=False)
            for name, target in zip(batch, targets, strict=True):
                if target is None:
                    pipe.delete(name)
                else:
                    pipe.renamenx(name, target)
            answers = pipe.execute()
            clash = [t for t, a in zip(targets, answers, strict=True) if t and not a]
            if clash:
                raise errors.RequestRefused(
                    f"{len(clash)} keys exist under both names (e.g. {clash[0]!r}): "
                    "a process of this toolq wrote to the ledger before it was migrated; "
                    "nothing of theirs was overwritten"
                )
        plan.renamed += sum(1 for t in targets if t is not None)
        plan.deleted += sum(1 for t in targets if t is None)
        if len(names) > EVERY:
            progress(f"  {start + len(batch)} of {len(names)} keys")
    progress(f"  {plan.renamed} keys renamed, {plan.deleted} deleted")


def _step_2(client: redis.Redis, plan: Migration, progress: Progress) -> None:
    """Every history list folded into its record, and deleted, a batch per transaction."""
    keys = Keys(plan.prefix)
    hist_prefix = keys.tag + ":hist:"
    if plan.dry_run and plan.found == 1:  # step 1 did not rename: read the old names
        hist_prefix = plan.prefix + ":hist:"
    names = sorted(
        {as_text(k) for k in client.scan_iter(match=glob(hist_prefix) + "*", count=CHUNK)}
    )
    for start in range(0, len(names), FOLD_BATCH):
        batch = names[start : start + FOLD_BATCH]
        ops = [keys.op(name[len(hist_prefix) :]) for name in batch]
        read = client.pipeline(transaction=False)
        for name, op in zip(batch, ops, strict=True):
            read.lrange(name, 0, -1)
            read.exists(op)
            read.hexists(op, "hn")
        answers = read.execute()
        histories = answers[0::3]
        if not plan.dry_run:
            _fold(client, batch, ops, histories, answers[1::3], answers[2::3])
        plan.histories += len(batch)
        plan.entries += sum(len(h) for h in histories)
        if len(names) > EVERY:
            progress(f"  {start + len(batch)} of {len(names)} histories")
    progress(f"  {plan.histories} histories ({plan.entries} entries) folded into their records")


def _fold(
    client: redis.Redis,
    hists: list[str],
    ops: list[str],
    histories: list[list[Any]],
    exists: list[Any],
    folded: list[Any],
) -> None:
    """Each history into its record and its list deleted, the batch in one transaction
    (no writer runs meanwhile: :func:`migrate` checked). A record that holds a history
    already (``hn``) keeps it; a list without its record (expired) is deleted."""
    pipe = client.pipeline(transaction=True)
    for hist, op, entries, found, done in zip(hists, ops, histories, exists, folded, strict=True):
        if found and not done and entries:
            pipe.hset(op, mapping=dict(formats.history_fields(entries)))  # type: ignore[arg-type]
        pipe.delete(hist)
    pipe.execute()


#: Each step's runner, by the format it starts from (:data:`toolq.decisions.formats.STEPS`).
STEP_RUNNERS: dict[int, Callable[[redis.Redis, Migration, Progress], None]] = {
    1: _step_1,
    2: _step_2,
}
