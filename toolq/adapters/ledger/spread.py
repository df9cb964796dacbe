"""Spreading the cells over a Valkey Cluster's primaries (``toolq cells adopt|balance``).

A cell is one Cluster slot (its hash tag, :class:`toolq.core.keys.Keys`), and the
work of a deployment is spread over its cells evenly (:func:`toolq.core.cells.cell_of`).
But the 256 cell tags of a deployment fall unevenly into a Cluster's equal slot
ranges: bench/RESULTS.md measured the busiest of three primaries serving 0.36 of
the work, not 1/3. So the slots are balanced by *cells* per primary, not by slots:
:func:`plan` decides which cell slots go where, each primary ending with as even
a share of the cells as the slots allow, moving as few slots as it can; slots
without a cell stay where they are. :func:`balance` carries a plan out with
Valkey 9's atomic slot migration (``CLUSTER MIGRATESLOTS``), a batch of slots
at a time.

The step before, from one server to a Cluster (docs/cells.md): the single server,
restarted with ``cluster-enabled yes``, claims exactly the slots its keys are in;
:func:`adopt` assigns it the rest (``CLUSTER ADDSLOTSRANGE`` of the :func:`gaps`)
and meets empty primaries (``CLUSTER MEET``), which :func:`balance` then fills.

The decisions (:func:`parse_nodes`, :func:`gaps`, :func:`plan`, :func:`batches`)
are pure and tested as tables; the functions under "Against a Cluster" talk to it.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.crc import key_slot

from toolq.core import errors
from toolq.core.keys import Keys

SLOTS = 16384
#: Slots per ``CLUSTER MIGRATESLOTS``: one job snapshots its slots together, so a
#: batch is what progress is shown in (a slot of 10,000 operations took 0.2-0.7 s
#: to move here, docs/cells.md).
BATCH = 16
#: Flags of a node that cannot serve slots now.
_DOWN = frozenset({"fail", "fail?", "noaddr", "handshake"})


# ------------------------------------------------------------------- pure decisions


@dataclass(frozen=True)
class Primary:
    """A primary of the Cluster as ``CLUSTER NODES`` shows it."""

    id: str
    address: str
    slots: frozenset[int] = frozenset()
    myself: bool = False


@dataclass(frozen=True)
class Move:
    """One slot to move: ``cells`` of the deployment's cells go with it."""

    slot: int
    cells: int
    source: str
    target: str


@dataclass
class Plan:
    """Where the cells are and where they will be: cells per primary id."""

    moves: list[Move]
    before: dict[str, int]
    after: dict[str, int]
    cells: int = 0
    #: ``host:port`` of each primary id (filled by :func:`plan_for`).
    addresses: dict[str, str] = field(default_factory=dict)


def parse_nodes(text: str, host: str) -> list[Primary]:
    """The live primaries in ``CLUSTER NODES`` output, with the slots each serves.

    A node that has never met another shows its address as ``:port@bus``; it is
    on ``host`` (the one asked). Slots in transit (``[slot->-id]``) are left out:
    the source still serves them until the move ends.
    """
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = set(fields[2].split(","))
        if "master" not in flags or flags & _DOWN:
            continue
        address = fields[1].split("@", 1)[0].split(",", 1)[0]
        if address.startswith(":"):
            address = host + address
        slots: set[int] = set()
        for part in fields[8:]:
            if part.startswith("["):
                continue
            first, _, last = part.partition("-")
            slots.update(range(int(first), int(last or first) + 1))
        found.append(Primary(fields[0], address, frozenset(slots), "myself" in flags))
    return found


def gaps(served: Iterable[int]) -> list[tuple[int, int]]:
    """The ranges of slots (first, last) that no node serves."""
    taken = set(served)
    out: list[tuple[int, int]] = []
    start: int | None = None
    for slot in range(SLOTS + 1):
        free = slot < SLOTS and slot not in taken
        if free and start is None:
            start = slot
        elif not free and start is not None:
            out.append((start, slot - 1))
            start = None
    return out


def ranges(slots: Iterable[int]) -> list[tuple[int, int]]:
    """``slots`` as sorted contiguous ranges (first, last)."""
    out: list[tuple[int, int]] = []
    for slot in sorted(set(slots)):
        if out and out[-1][1] == slot - 1:
            out[-1] = (out[-1][0], slot)
        else:
            out.append((slot, slot))
    return out


def cell_slots(prefix: str, cells: int) -> Counter[int]:
    """How many of the deployment's cells each slot holds (most hold none or one)."""
    return Counter(key_slot(Keys(prefix, cell).due.encode()) for cell in range(cells))


def plan(weights: Mapping[int, int], owners: Mapping[int, str], primaries: Sequence[str]) -> Plan:
    """Which cell slots move where so each primary serves as even a share of cells
    as the slots allow, moving as few slots as it can.

    ``weights``: cells per slot (slots without cells may be left out);
    ``owners``: slot -> the primary serving it; ``primaries``: every primary that
    may serve cells, the empty ones too. Greedy: while moving a slot from the
    primary with the most cells to the one with the fewest narrows the gap
    between them (its cells < the gap), move the slot whose cells are nearest half
    the gap. With one cell per slot (the usual case: 256 tags of one prefix are
    256 slots) that ends with every primary at floor or ceil of cells/primaries,
    in the fewest moves (tests/unit/test_spread.py checks both). A slot moved
    twice by the loop is one move, from where it was to where it ends.
    """
    if not primaries:
        raise ValueError("no primary to spread the cells over")
    loads = dict.fromkeys(primaries, 0)
    held: dict[str, set[int]] = {p: set() for p in primaries}
    for slot, cells in weights.items():
        if cells <= 0:
            continue
        owner = owners.get(slot)
        if owner not in loads:
            raise ValueError(f"slot {slot} holds cells but no primary listed serves it")
        loads[owner] += cells
        held[owner].add(slot)
    before = dict(loads)
    where = {slot: owners[slot] for slots in held.values() for slot in slots}
    # Ties break by the order of ``primaries``: the same input, the same plan.
    order = {p: i for i, p in enumerate(primaries)}
    while True:
        most = max(primaries, key=lambda p: (loads[p], -order[p]))
        fewest = min(primaries, key=lambda p: (loads[p], order[p]))
        gap = loads[most] - loads[fewest]
        fits = [s for s in held[most] if weights[s] < gap]
        if not fits:
            break
        slot = min(fits, key=lambda s: (abs(2 * weights[s] - gap), s))
        held[most].remove(slot)
        held[fewest].add(slot)
        loads[most] -= weights[slot]
        loads[fewest] += weights[slot]
        where[slot] = fewest
    moves = [
        Move(slot, weights[slot], owners[slot], target)
        for slot, target in sorted(where.items())
        if target != owners[slot]
    ]
    return Plan(moves, before, loads, cells=sum(before.values()))


def joiners(
    joining: Sequence[str],
    known: Iterable[str],
    resolve: Callable[[str], str] = socket.gethostbyname,
) -> list[str]:
    """The ``host:port`` addresses of ``joining`` not among ``known`` (the Cluster's
    primaries), compared resolved: ``CLUSTER NODES`` shows the IP that ``CLUSTER MEET``
    resolved a host name to, so a node met as ``localhost:7001`` by an interrupted run
    is ``127.0.0.1:7001`` there. A name that does not resolve is kept as given (it is
    not met: :func:`adopt` finds it does not answer)."""

    def resolved(address: str) -> str:
        host, _, port = address.rpartition(":")
        try:
            return f"{resolve(host)}:{port}"
        except OSError:
            return address

    met = {resolved(a) for a in known}
    return [a for a in joining if resolved(a) not in met]


def batches(moves: Sequence[Move], size: int = BATCH) -> list[list[Move]]:
    """The moves grouped by (source, target), at most ``size`` slots a batch: one
    ``CLUSTER MIGRATESLOTS`` each."""
    pairs: dict[tuple[str, str], list[Move]] = {}
    for move in moves:
        pairs.setdefault((move.source, move.target), []).append(move)
    return [group[i : i + size] for group in pairs.values() for i in range(0, len(group), size)]


# ------------------------------------------------------------------- against a Cluster


class Nodes:
    """Connections to a Cluster's nodes, made like the one ``client`` has (same
    password, TLS and timeouts), keyed by ``host:port``; close them with :meth:`close`."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        kwargs = client.connection_pool.connection_kwargs
        self.host = str(kwargs.get("host", "127.0.0.1"))
        self._made: dict[str, redis.Redis] = {}

    def at(self, address: str) -> redis.Redis:
        if address not in self._made:
            host, _, port = address.rpartition(":")
            pool = self.client.connection_pool
            kwargs = {**pool.connection_kwargs, "host": host, "port": int(port)}
            self._made[address] = redis.Redis(
                connection_pool=redis.ConnectionPool(
                    connection_class=pool.connection_class, **kwargs
                )
            )
        return self._made[address]

    def close(self) -> None:
        for made in self._made.values():
            made.close()
        self._made.clear()


def primaries(client: redis.Redis, host: str) -> list[Primary]:
    """The Cluster's live primaries as ``client``'s node sees them; RequestRefused
    when that node is not a Cluster node."""
    try:
        text = _call(client, "CLUSTER", "NODES")
    except redis.ResponseError as exc:
        if "cluster support disabled" in str(exc):
            raise errors.RequestRefused(
                "this server is not a Cluster node (cluster-enabled no); on one server "
                "every cell is on it already"
            ) from None
        raise
    return parse_nodes(_text(text), host)


def cluster_state(client: redis.Redis) -> str:
    text = _text(_call(client, "CLUSTER", "INFO"))
    info = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return str(info.get("cluster_state", "unknown"))


def recorded_cells(nodes: Nodes, found: Sequence[Primary], prefix: str) -> int:
    """The deployment's number of cells, from ``{prefix}:meta`` on the primary serving it."""
    meta = Keys(prefix).meta
    slot = key_slot(meta.encode())
    owner = next((p for p in found if slot in p.slots), None)
    value = nodes.at(owner.address).hget(meta, "cells") if owner else None
    if value is None:
        raise errors.RequestRefused(
            f"no cells are recorded in {meta}: run `toolq cells migrate` on the single "
            "server first, or start a process with TOOLQ_CELLS"
        )
    return int(value)


def plan_for(client: redis.Redis, nodes: Nodes, prefix: str) -> Plan:
    """The balance plan of the deployment ``prefix`` on ``client``'s Cluster."""
    found = primaries(client, nodes.host)
    state = cluster_state(client)
    if state != "ok":
        raise errors.RequestRefused(
            f"the Cluster is not ok (cluster_state:{state}): every slot needs a live primary "
            "first (`toolq cells adopt` assigns a converted server's gaps)"
        )
    cells = recorded_cells(nodes, found, prefix)
    owners = {slot: p.id for p in found for slot in p.slots}
    made = plan(cell_slots(prefix, cells), owners, [p.id for p in found])
    made.addresses = {p.id: p.address for p in found}
    return made


def migrate(
    nodes: Nodes,
    batch: Sequence[Move],
    addresses: Mapping[str, str],
    timeout: float = 120.0,
) -> None:
    """Move one batch (one source, one target) with ``CLUSTER MIGRATESLOTS`` and
    return once the source no longer serves any of its slots; RequestRefused when
    the job failed or did not end in ``timeout`` seconds."""
    source = nodes.at(addresses[batch[0].source])
    target = batch[0].target
    slots = {m.slot for m in batch}
    spans = [str(x) for first, last in ranges(slots) for x in (first, last)]
    began = time.time()
    _call(source, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", *spans, "NODE", target)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = next((p for p in primaries(source, nodes.host) if p.myself), None)
        if mine is None:  # it failed over meanwhile (a replica now): nothing says moved
            raise errors.RequestRefused(
                f"{addresses[batch[0].source]} is no longer a primary while moving slots "
                f"{ranges(slots)}: run `toolq cells balance` again once the Cluster is ok"
            )
        if not slots & mine.slots:
            return
        for job in _call(source, "CLUSTER", "GETSLOTMIGRATIONS") or []:
            info = _job(job)
            if (
                info.get("target_node") == target
                and info.get("state") in {"failed", "cancelled"}
                and float(info.get("create_time") or 0) >= int(began)
                and set(_slots_of(info.get("slot_ranges", ""))) & slots
            ):
                raise errors.RequestRefused(
                    f"moving slots {ranges(slots)} to {addresses[target]} {info['state']}: "
                    f"{info.get('message') or 'no reason given'}"
                )
        time.sleep(0.05)
    raise errors.RequestRefused(f"moving slots {ranges(slots)} did not end in {timeout:g} s")


def balance(nodes: Nodes, made: Plan, progress: Callable[[int, int, list[Move]], None]) -> None:
    """Carry ``made`` out, batch by batch; ``progress(slots moved, of, batch)`` after each."""
    done = 0
    for batch in batches(made.moves):
        migrate(nodes, batch, made.addresses)
        done += len(batch)
        progress(done, len(made.moves), batch)


def adopt(
    client: redis.Redis,
    nodes: Nodes,
    joining: Sequence[str],
    timeout: float = 30.0,
    progress: Callable[[str], None] = lambda _: None,
) -> list[tuple[int, int]]:
    """Make ``client``'s node (a server restarted with ``cluster-enabled yes``) a
    whole Cluster: it serves every slot no node serves, and meets the empty primaries
    at ``joining`` (``host:port``). Returns the ranges it added; RequestRefused when
    a joining node is not an empty Cluster node, or the Cluster is not ok in time."""
    found = primaries(client, nodes.host)
    # A node met by an earlier, interrupted run is in the Cluster already.
    joining = joiners(joining, [p.address for p in found])
    for address in joining:
        _check_empty(nodes, address)
    added = gaps(slot for p in found for slot in p.slots)
    if added:
        spans = [x for first, last in added for x in (first, last)]
        _call(client, "CLUSTER", "ADDSLOTSRANGE", *spans)
        progress(f"assigned {sum(b - a + 1 for a, b in added)} slots in {len(added)} ranges")
    for address in joining:
        host, _, port = address.rpartition(":")
        _call(client, "CLUSTER", "MEET", socket.gethostbyname(host), int(port))
        progress(f"met {address}")
    want = len(found) + len(joining)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        whole = cluster_state(client) == "ok" and len(primaries(client, nodes.host)) >= want
        if whole and all(cluster_state(nodes.at(a)) == "ok" for a in joining):
            return added
        time.sleep(0.1)
    raise errors.RequestRefused(f"the Cluster was not ok with {want} primaries in {timeout:g} s")


def _check_empty(nodes: Nodes, address: str) -> None:
    node = nodes.at(address)
    try:
        known = primaries(node, address.rpartition(":")[0])
        size = int(node.dbsize())
    except redis.ConnectionError:
        raise errors.RequestRefused(f"{address} does not answer") from None
    except errors.RequestRefused:
        raise errors.RequestRefused(
            f"{address} is not a Cluster node (cluster-enabled no)"
        ) from None
    if size or len(known) != 1 or known[0].slots:
        raise errors.RequestRefused(
            f"{address} is not an empty Cluster node (keys: {size}, "
            f"nodes it knows: {len(known)}): only empty primaries join"
        )


def _job(raw: Any) -> dict[str, Any]:
    """One GETSLOTMIGRATIONS entry as a dict (a map in RESP3, pairs in RESP2)."""
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    items = list(raw)
    return {_text(items[i]): _text(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def _slots_of(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split():
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def _call(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
