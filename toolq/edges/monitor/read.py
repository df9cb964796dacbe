"""Reading the ledger for the status snapshot: every number from a key whose name is
known in advance, all sent in one pipeline (see :mod:`toolq.edges.monitor`).

Where the numbers live is :class:`Sources`: the layout's cells (each read and merged:
counts summed, tools united, the oldest the earliest) and the queues' backlog, one
class per publish mode (:class:`QueueLists`: the broker's lists in the ledger's
server; :class:`Outboxes`: the outbox streams and relays, the depths the broker's).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from toolq.adapters.ledger import dep_state as deps
from toolq.adapters.ledger import outbox
from toolq.adapters.liveness import ALIVE_MS, worker_beats, worker_nodes
from toolq.core.deps import DepView
from toolq.core.keys import KOMBU_UNACKED, Keys
from toolq.core.layout import Layout, SingleTag
from toolq.core.settings import ToolqSettings
from toolq.core.states import State
from toolq.core.text import as_text
from toolq.edges.monitor.shape import AGED, STATES, rates, shape, shape_workers, waiting
from toolq.services.scheduler import series as samples
from toolq.topology import topology_for
from toolq.topology.publish import Inline, Outbox, Publish

# kombu's Redis transport: a queue with priorities keeps one list per step
# (``name``, ``name\x06\x163``, ...); its unacknowledged messages are in
# ``toolq.core.keys.KOMBU_UNACKED``.
_KOMBU_PRIORITY_SEP = "\x06\x16"
_KOMBU_PRIORITY_STEPS = (3, 6, 9)

WorkerProbe = Callable[[], dict[str, Any]]
#: Outbox mode: reads each queue's depth from the broker (None: it did not answer).
BrokerDepths = Callable[[Iterable[str]], dict[str, int | None]]


class Backlog(ABC):
    """Where the queues' backlog is read (one class per publish mode)."""

    @abstractmethod
    def queue(self, pipe: Any, src: Sources) -> None:
        """Add its reads to the status pipeline."""

    @abstractmethod
    def parse(self, replies: Iterator[Any], src: Sources, now_ms: int, out: dict[str, Any]) -> None:
        """Into ``out``: ``queues`` (depth per queue), ``unacked`` and ``outbox``."""

    def depths(self, out: dict[str, Any], src: Sources, read: BrokerDepths | None) -> None:  # noqa: B027
        """The broker's own depths, where they are not in the ledger's server."""

    def broker_depths(self, settings: ToolqSettings) -> BrokerDepths | None:
        """A reader of the broker's queue depths; None: the ledger is the broker."""
        return None


class QueueLists(Backlog):
    """The ledger is the broker: its queue lists (every priority step's) and kombu's
    ``unacked`` hash."""

    def queue(self, pipe: Any, src: Sources) -> None:
        for queue in src.queues:
            for key in _queue_keys(queue):
                pipe.llen(key)
        pipe.hlen(src.unacked_key)

    def parse(self, replies: Iterator[Any], src: Sources, now_ms: int, out: dict[str, Any]) -> None:
        out["queues"] = {q: sum(int(next(replies)) for _ in _queue_keys(q)) for q in src.queues}
        out["unacked"] = int(next(replies))
        out["outbox"] = None


class Outboxes(Backlog):
    """Outbox mode: the queues are the broker's (read through ``broker_depths``, if
    given); the outbox streams (summed over the cells, the head the oldest) and the
    relays' beats are read instead, and ``unacked`` is None (the broker's own)."""

    def queue(self, pipe: Any, src: Sources) -> None:
        for cell in src.cell_keys:
            pipe.xlen(cell.outbox)
            pipe.xrange(cell.outbox, count=1)
        pipe.hgetall(src.keys.relays)

    def parse(self, replies: Iterator[Any], src: Sources, now_ms: int, out: dict[str, Any]) -> None:
        length, head = 0, None
        for _ in src.cell_keys:  # entries summed; the head: the oldest of the cells'
            length += int(next(replies))
            first = next(replies)
            if first and (
                head is None or outbox.entry_ms(first[0][0]) < outbox.entry_ms(head[0][0])
            ):
                head = first
        out["queues"], out["unacked"] = {}, None
        out["outbox"] = outbox.parse_status(length, head, next(replies), now_ms, ALIVE_MS)

    def depths(self, out: dict[str, Any], src: Sources, read: BrokerDepths | None) -> None:
        if read is not None:
            out["queues"] = {q: n for q, n in read(src.queues).items() if n is not None}

    def broker_depths(self, settings: ToolqSettings) -> BrokerDepths | None:
        """Each time on a connection of its own (kombu is imported only then)."""
        url = str(topology_for(settings).broker(None))

        def read(names: Iterable[str]) -> dict[str, int | None]:
            from toolq.adapters.broker.app import transport_options
            from toolq.adapters.broker.depth import Depths

            depths = Depths(url, timeout=1.0, transport_options=transport_options(settings, url))
            try:
                return depths.read(names)
            finally:
                depths.close()

        return read


@dataclass(frozen=True)
class Sources:
    """Where the numbers live: the ledger's keys and the broker's queue lists."""

    keys: Keys
    queues: tuple[str, ...] = ("toolq.calls", "toolq.verify")
    unacked_key: str = KOMBU_UNACKED
    #: Where the queues' backlog is read (:class:`Outboxes` in outbox mode).
    backlog: Backlog = field(default_factory=lambda: QueueLists())
    #: The ledger's cells (None: the single tag of :attr:`keys`); :attr:`keys` names
    #: the deployment-wide keys.
    layout: Layout | None = None
    #: A worker beat older than this (ms) is not live (``worker.alive_s``).
    alive_ms: int = ALIVE_MS

    @property
    def cell_keys(self) -> list[Keys]:
        """The keys of every cell; :attr:`keys` alone with the single tag."""
        layout = self.layout or SingleTag(self.keys.prefix)
        return layout.every_cell()


def settings_sources(settings: ToolqSettings) -> Sources:
    """Where a deployment with these settings keeps the numbers."""
    q = settings.queues
    topology = topology_for(settings)
    backlogs: dict[type[Publish], Callable[[], Backlog]] = {Inline: QueueLists, Outbox: Outboxes}
    return Sources(
        topology.layout.root,
        (q.calls, q.verify),
        backlog=backlogs[type(topology.publish)](),
        layout=topology.layout,
        alive_ms=int(settings.worker.alive_s * 1000),
    )


def broker_depths(settings: ToolqSettings) -> BrokerDepths | None:
    """Outbox mode: a reader of the broker's queue depths, on a connection of its own
    each time (kombu is imported only then); None when the ledger is the broker."""
    return settings_sources(settings).backlog.broker_depths(settings)


def read_status(
    client: redis.Redis,
    sources: Sources,
    *,
    now_ms: int,
    tools_hint: Iterable[str] = (),
    workers: WorkerProbe | None = None,
    beats: bool = False,
    broker_depths: BrokerDepths | None = None,
) -> dict[str, Any]:
    """Read and shape the snapshot: one pipeline for the tools in ``tools_hint``.

    In outbox mode the queue depths are ``broker_depths``' (none without it).

    Tools the ledger knows but the hint did not name cost one more round trip.
    ``workers`` is a probe to run meanwhile (a Celery ping); without one, ``beats``
    says whether the workers' heartbeats are shown as the live workers.
    """
    probe = _Background(workers) if workers is not None else None
    guess = sorted(set(tools_hint))
    fields = samples.series_fields(now_ms, 1.0)
    pipe = client.pipeline(transaction=False)
    queue_common(pipe, sources, now_ms)
    pipe.hmget(sources.keys.series, [str(f) for f in fields])
    for tool in guess:
        queue_tool(pipe, sources, tool)
    layout = sources.layout or SingleTag(sources.keys.prefix)
    deps.queue_list(pipe, layout)
    replies = iter(pipe.execute())
    common = parse_common(replies, sources, now_ms)
    sampled = [samples.parse_sample(raw) for raw in next(replies)]
    per_tool = {tool: parse_tool(replies, sources) for tool in guess}
    dep_names = deps.parse_list([next(replies) for _ in layout.every_cell()])
    ledger_tools = known_tools(common)
    missing = sorted(ledger_tools - set(guess))
    if missing:
        pipe = client.pipeline(transaction=False)
        for tool in missing:
            queue_tool(pipe, sources, tool)
        more = iter(pipe.execute())
        per_tool.update({tool: parse_tool(more, sources) for tool in missing})
    sources.backlog.depths(common, sources, broker_depths)
    snap = shape_read(common, per_tool, ledger_tools, sources, now_ms)
    if probe is not None:
        snap["workers"] = probe.result()
    elif beats:
        snap["workers"] = shape_workers(common["nodes"], now_ms, sources.alive_ms)
    else:
        snap["workers"] = {"checked": False}
    snap["waiting"] = waiting(snap, now_ms)
    snap["rates"] = rates(samples.points(sampled), now_ms)
    snap["deps"] = dep_attention(client, layout, dep_names, now_ms)
    return snap


def dep_attention(
    client: redis.Redis, layout: Layout, names: list[str], now_ms: int
) -> list[dict[str, Any]]:
    """The dependency keys that are paused, whose breaker is not closed, or that hold
    calls back (one more round trip, only when the ledger has keys)."""
    if not names:
        return []
    views = deps.DepState(client, layout).views(now_ms, names)
    return [attention_of(v) for v in views if deps.needs_attention(v)]


def attention_of(view: DepView) -> dict[str, Any]:
    """A key in the snapshot's ``deps``: its :class:`DepView` fields, as JSON."""
    return view.model_dump(mode="json", include=set(DepView.model_fields))


def known_tools(common: dict[str, Any]) -> set[str]:
    """Every tool the ledger knows: its set of tools, and those its counters name."""
    tools: set[str] = common["tools"] | {name.partition("|")[0] for name in common["stats"]}
    return tools


def shape_read(
    common: dict[str, Any],
    per_tool: dict[str, Any],
    ledger_tools: set[str],
    sources: Sources,
    now_ms: int,
) -> dict[str, Any]:
    """The snapshot (:func:`shape`) from what one status read found."""
    return shape(
        now_ms=now_ms,
        prefix=sources.keys.prefix,
        tools={t: per_tool[t] for t in sorted(ledger_tools)},
        stats=common["stats"],
        queues=common["queues"],
        unacked=common["unacked"],
        due=common["due"],
        schedulers=common["schedulers"],
        worker_beats=common["worker_beats"],
        outbox=common["outbox"],
        alive_ms=sources.alive_ms,
    )


# --------------------------------------------------------------------------- the reads


def _queue_keys(queue: str) -> list[str]:
    return [queue, *(f"{queue}{_KOMBU_PRIORITY_SEP}{step}" for step in _KOMBU_PRIORITY_STEPS)]


def queue_common(pipe: Any, src: Sources, now_ms: int) -> None:
    for k in src.cell_keys:
        pipe.smembers(k.tools)
        pipe.hgetall(k.stats)
        pipe.zcard(k.due)
        pipe.zcount(k.due, "-inf", now_ms)
        pipe.zrange(k.due, 0, 0, withscores=True)
    k = src.keys
    pipe.hgetall(k.schedulers)
    pipe.hgetall(k.workers)
    pipe.hgetall(k.worker_nodes)
    src.backlog.queue(pipe, src)


def parse_common(replies: Iterator[Any], src: Sources, now_ms: int) -> dict[str, Any]:
    tools: set[str] = set()
    stats: dict[str, int] = {}
    backlog = due_now = 0
    earliest: int | None = None
    for _ in src.cell_keys:  # summed over the cells (one without)
        tools |= {as_text(t) for t in next(replies)}
        for k, v in next(replies).items():
            stats[as_text(k)] = stats.get(as_text(k), 0) + int(v)
        backlog, due_now, first = (
            backlog + int(next(replies)),
            due_now + int(next(replies)),
            next(replies),
        )
        if first and (earliest is None or int(first[0][1]) < earliest):
            earliest = int(first[0][1])
    schedulers = {as_text(k): int(float(v)) for k, v in next(replies).items()}
    beats = worker_beats(next(replies))
    nodes = worker_nodes(next(replies))
    out: dict[str, Any] = {
        "tools": tools,
        "stats": stats,
        "due": (backlog, due_now, earliest),
        "schedulers": schedulers,
        "worker_beats": beats,
        "nodes": nodes,
    }
    src.backlog.parse(replies, src, now_ms, out)  # queues, unacked, outbox
    return out


def queue_tool(pipe: Any, src: Sources, tool: str) -> None:
    for keys in src.cell_keys:
        for state in STATES:
            pipe.zcard(keys.index(tool, state))
        for state in AGED:
            pipe.zrange(keys.index(tool, state), 0, 0, withscores=True)


def parse_tool(
    replies: Iterator[Any], src: Sources
) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    counts = dict.fromkeys(STATES, 0)
    oldest: dict[str, tuple[str, int]] = {}
    for _ in src.cell_keys:  # summed over the cells; the oldest of the cells'
        for state in STATES:
            counts[state] += int(next(replies))
        for state in AGED:
            first = next(replies)
            if first and (state not in oldest or int(first[0][1]) < oldest[state][1]):
                oldest[state] = (as_text(first[0][0]), int(first[0][1]))
    return counts, oldest


def queue_escalated(pipe: Any, src: Sources, tool: str) -> None:
    for keys in src.cell_keys:
        pipe.zrange(keys.index(tool, State.ESCALATED), 0, 0, withscores=True)


def parse_escalated(replies: Iterator[Any], src: Sources) -> Any:
    """The oldest escalated operation over the cells (ZRANGE's reply shape)."""
    found: Any = []
    for _ in src.cell_keys:
        first = next(replies)
        if first and (not found or int(first[0][1]) < int(found[0][1])):
            found = first
    return found


class _Background:
    """Runs a probe on a daemon thread while the pipeline is out."""

    def __init__(self, fn: WorkerProbe) -> None:
        self._fn = fn
        self._out: dict[str, Any] = {"checked": True, "live": None, "names": []}
        self._thread = threading.Thread(target=self._run, name="toolq-status-ping", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._out = self._fn()

    def result(self) -> dict[str, Any]:
        self._thread.join()
        return self._out
