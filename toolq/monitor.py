"""What a toolq deployment is doing now, read from indexes only.

:func:`status_snapshot` answers with counts per tool and state, the age of the
oldest operation in every non-terminal state, the broker's queue depths, the
scheduler's backlog and heartbeats, each queue's last worker heartbeat and
every worker's own (:mod:`toolq.liveness`), and the ledger's counters.
Every number comes from a key whose name is known in advance (``ZCARD`` and
``ZRANGE 0 0`` of the per-tool-per-state indexes, ``LLEN`` of the queue lists,
``HLEN`` of kombu's ``unacked`` hash, ...), all sent in one pipeline: the cost
grows with the number of tools, not of operations, and the keyspace is never
scanned. Counts of finished states cover the retention window (the scheduler
trims older index entries). Live workers are the ones whose heartbeat is
recent: no Celery broadcast, whose ping waits out its timeout (``toolq status
--ping`` still asks for one).

The snapshot is a plain JSON-able dict: ``toolq status --json`` prints it and
the HTTP API's ``GET /v1/status`` returns it. :func:`toolq.cli.monitor.render_status`
turns it into the table ``toolq status`` shows.

:func:`overview` is the console's: the snapshot, read on ``tq.aio``, plus the
pending-recovery summary, the scheduler's lag, each worker and the recent
rates; :func:`series` is its chart (:mod:`toolq.scheduler.series`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aioredis

from toolq.keys import KOMBU_UNACKED, Keys
from toolq.ledger import outbox
from toolq.liveness import ALIVE_MS, WorkerNode, worker_beats, worker_nodes
from toolq.scheduler import series as samples
from toolq.scheduler.series import Point
from toolq.settings import ToolqSettings
from toolq.states import PENDING_RECOVERY, TERMINAL, State

if TYPE_CHECKING:
    from toolq.aio import AsyncToolQueue
    from toolq.queue import ToolQueue

STATES: tuple[str, ...] = tuple(str(s) for s in State)
PENDING: tuple[str, ...] = tuple(str(s) for s in PENDING_RECOVERY)
#: States whose oldest operation's age is reported (finished ones do not age).
AGED: tuple[str, ...] = tuple(str(s) for s in State if s not in TERMINAL)
#: A scheduler whose last heartbeat is older than this is not counted as live
#: (the same window as a worker's: toolq.liveness.ALIVE_MS).
SCHEDULER_ALIVE_MS = ALIVE_MS
#: Counters every tool reports, 0 when the ledger has not counted one yet.
COUNTERS: tuple[str, ...] = (
    "submitted", "attempts", "succeeded", "failed", "escalated", "cancelled", "unknown",
    "no_verifier", "verify_found", "verify_not_found", "verify_recheck", "verify_failed",
    "verify_escalated", "verify_published", "duplicates_prevented", "lease_lost",
    "republished", "dispatched", "retried_now", "verified_now",
)  # fmt: skip
#: What the console's overview lists as waiting on recovery, or on a person.
RECOVERY: tuple[str, ...] = (*PENDING, State.ESCALATED.value)
#: The chart shows at most this many hours (what the series keeps).
MAX_SERIES_HOURS = samples.KEEP_S / 3600

# kombu's Redis transport: a queue with priorities keeps one list per step
# (``name``, ``name\x06\x163``, ...); its unacknowledged messages are in
# ``toolq.keys.KOMBU_UNACKED``.
_KOMBU_PRIORITY_SEP = "\x06\x16"
_KOMBU_PRIORITY_STEPS = (3, 6, 9)

WorkerProbe = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Sources:
    """Where the numbers live: the ledger's keys and the broker's queue lists."""

    keys: Keys
    queues: tuple[str, ...] = ("toolq.calls", "toolq.verify")
    unacked_key: str = KOMBU_UNACKED
    #: Outbox mode: the queues are the broker's (read through ``broker_depths``, if
    #: given), and the ledger's outbox stream and relays are read instead.
    outbox: bool = False
    #: Cells mode (``ToolqSettings.cells``): the ledger's per-cell keys (due, stats,
    #: tools, indexes, outbox) are read in every cell and merged: counts summed, tools
    #: united, the oldest the earliest. :attr:`keys` then names the deployment-wide ones.
    cells: int | None = None

    @property
    def cell_keys(self) -> list[Keys]:
        """The keys of every cell; :attr:`keys` alone without cells."""
        if self.cells is None:
            return [self.keys]
        return [Keys(self.keys.prefix, cell) for cell in range(self.cells)]


#: Outbox mode: reads each queue's depth from the broker (None: it did not answer).
BrokerDepths = Callable[[Iterable[str]], dict[str, int | None]]


def settings_sources(settings: ToolqSettings) -> Sources:
    """Where a deployment with these settings keeps the numbers."""
    q = settings.queues
    return Sources(
        Keys(settings.prefix), (q.calls, q.verify), outbox=settings.outbox, cells=settings.cells
    )


def broker_depths(settings: ToolqSettings) -> BrokerDepths | None:
    """Outbox mode: a reader of the broker's queue depths, on a connection of its own
    each time (kombu is imported only then); None when the ledger is the broker."""
    if settings.broker_url is None:
        return None
    url = settings.broker_url.get_secret_value()

    def read(names: Iterable[str]) -> dict[str, int | None]:
        from toolq.broker.app import transport_options
        from toolq.broker.depth import Depths

        depths = Depths(url, timeout=1.0, transport_options=transport_options(settings, url))
        try:
            return depths.read(names)
        finally:
            depths.close()

    return read


def status_snapshot(
    tq: ToolQueue,
    *,
    now_ms: int | None = None,
    workers: bool = True,
    worker_timeout: float = 0.5,
    ping: bool = False,
) -> dict[str, Any]:
    """The deployment's status as a JSON-able dict (see the module docstring).

    Live workers come from their heartbeats (one Redis round trip in all);
    ``ping=True`` asks Celery instead (a broadcast that waits ``worker_timeout``);
    ``workers=False`` leaves them out.
    """
    sources = settings_sources(tq.settings)
    hint = frozenset(t.name for t in tq.registry) | tq.app.seen_tools
    probe = (lambda: ping_workers(tq, worker_timeout)) if workers and ping else None
    now = int(tq.clock() * 1000) if now_ms is None else now_ms
    snap = read_status(
        tq.redis,
        sources,
        now_ms=now,
        tools_hint=hint,
        workers=probe,
        beats=workers and not ping,
        broker_depths=broker_depths(tq.settings),
    )
    # the next snapshot needs one round trip even for tools this registry does not know
    tq.app.seen_tools = frozenset(snap["tools"])
    return snap


def ping_workers(tq: ToolQueue, timeout: float = 0.5) -> dict[str, Any]:
    """Live Celery workers: the nodes that answer a broadcast ping within ``timeout``."""
    try:
        replies = tq.celery.control.inspect(timeout=timeout).ping() or {}
    except Exception as exc:  # a broken broadcast must not take the status down with it
        return {"checked": True, "live": None, "names": [], "error": type(exc).__name__}
    names = sorted(str(n) for n in replies)
    return {"checked": True, "live": len(names), "names": names}


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
    pipe = client.pipeline(transaction=False)
    _queue_common(pipe, sources, now_ms)
    for tool in guess:
        _queue_tool(pipe, sources, tool)
    replies = iter(pipe.execute())
    common = _parse_common(replies, sources, now_ms)
    per_tool = {tool: _parse_tool(replies, sources) for tool in guess}
    ledger_tools = _ledger_tools(common)
    missing = sorted(ledger_tools - set(guess))
    if missing:
        pipe = client.pipeline(transaction=False)
        for tool in missing:
            _queue_tool(pipe, sources, tool)
        more = iter(pipe.execute())
        per_tool.update({tool: _parse_tool(more, sources) for tool in missing})
    if sources.outbox and broker_depths is not None:
        depths = broker_depths(sources.queues)
        common["queues"] = {q: n for q, n in depths.items() if n is not None}
    snap = _shape_read(common, per_tool, ledger_tools, sources, now_ms)
    if probe is not None:
        snap["workers"] = probe.result()
    elif beats:
        snap["workers"] = shape_workers(common["nodes"], now_ms)
    else:
        snap["workers"] = {"checked": False}
    snap["waiting"] = waiting(snap, now_ms)
    return snap


def waiting(snap: dict[str, Any], now_ms: int) -> list[dict[str, Any]]:
    """The live processes waiting for a dependency, from their beats: who (``relay
    ID``, ``worker NODE``), for what, since when (ms) and how long. Pure."""
    found = [(f"relay {w['id']}", w) for w in (snap.get("outbox") or {}).get("waiting", ())] + [
        (f"worker {n['node']}", n["waiting"])
        for n in snap.get("workers", {}).get("nodes", ())
        if n.get("alive") and n.get("waiting")
    ]
    return [
        {
            "who": who,
            "for": w["for"],
            "since_ms": w["since"],
            "age_s": _secs(max(0, now_ms - w["since"])),
        }
        for who, w in found
    ]


def _ledger_tools(common: dict[str, Any]) -> set[str]:
    """Every tool the ledger knows: its set of tools, and those its counters name."""
    tools: set[str] = common["tools"] | {name.partition("|")[0] for name in common["stats"]}
    return tools


def _shape_read(
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
    )


# --------------------------------------------------------------------------- the reads


def _queue_keys(queue: str) -> list[str]:
    return [queue, *(f"{queue}{_KOMBU_PRIORITY_SEP}{step}" for step in _KOMBU_PRIORITY_STEPS)]


def _queue_common(pipe: Any, src: Sources, now_ms: int) -> None:
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
    if src.outbox:
        for cell in src.cell_keys:
            pipe.xlen(cell.outbox)
            pipe.xrange(cell.outbox, count=1)
        pipe.hgetall(k.relays)
        return
    for queue in src.queues:
        for key in _queue_keys(queue):
            pipe.llen(key)
    pipe.hlen(src.unacked_key)


def _parse_common(replies: Iterator[Any], src: Sources, now_ms: int) -> dict[str, Any]:
    tools: set[str] = set()
    stats: dict[str, int] = {}
    backlog = due_now = 0
    earliest: int | None = None
    for _ in src.cell_keys:  # summed over the cells (one without)
        tools |= {_s(t) for t in next(replies)}
        for k, v in next(replies).items():
            stats[_s(k)] = stats.get(_s(k), 0) + int(v)
        backlog, due_now, first = (
            backlog + int(next(replies)),
            due_now + int(next(replies)),
            next(replies),
        )
        if first and (earliest is None or int(first[0][1]) < earliest):
            earliest = int(first[0][1])
    schedulers = {_s(k): int(float(v)) for k, v in next(replies).items()}
    beats = worker_beats(next(replies))
    nodes = worker_nodes(next(replies))
    box: dict[str, Any] | None = None
    queues: dict[str, int] = {}
    unacked: int | None = None
    if src.outbox:
        length, head = 0, None
        for _ in src.cell_keys:  # entries summed; the head: the oldest of the cells'
            length += int(next(replies))
            first = next(replies)
            if first and (
                head is None or outbox.entry_ms(first[0][0]) < outbox.entry_ms(head[0][0])
            ):
                head = first
        box = outbox.parse_status(length, head, next(replies), now_ms, ALIVE_MS)
    else:
        queues = {q: sum(int(next(replies)) for _ in _queue_keys(q)) for q in src.queues}
        unacked = int(next(replies))
    return {
        "tools": tools,
        "stats": stats,
        "due": (backlog, due_now, earliest),
        "schedulers": schedulers,
        "worker_beats": beats,
        "nodes": nodes,
        "queues": queues,
        "unacked": unacked,
        "outbox": box,
    }


def _queue_tool(pipe: Any, src: Sources, tool: str) -> None:
    for keys in src.cell_keys:
        for state in STATES:
            pipe.zcard(keys.index(tool, state))
        for state in AGED:
            pipe.zrange(keys.index(tool, state), 0, 0, withscores=True)


def _parse_tool(
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
                oldest[state] = (_s(first[0][0]), int(first[0][1]))
    return counts, oldest


def _queue_escalated(pipe: Any, src: Sources, tool: str) -> None:
    for keys in src.cell_keys:
        pipe.zrange(keys.index(tool, State.ESCALATED), 0, 0, withscores=True)


def _parse_escalated(replies: Iterator[Any], src: Sources) -> Any:
    """The oldest escalated operation over the cells (ZRANGE's reply shape)."""
    found: Any = []
    for _ in src.cell_keys:
        first = next(replies)
        if first and (not found or int(first[0][1]) < int(found[0][1])):
            found = first
    return found


# --------------------------------------------------------------------------- shaping (pure)


def shape(
    *,
    now_ms: int,
    prefix: str,
    tools: dict[str, tuple[dict[str, int], dict[str, tuple[str, int]]]],
    stats: dict[str, int],
    queues: dict[str, int],
    unacked: int | None,
    due: tuple[int, int, int | None],
    schedulers: dict[str, int],
    worker_beats: dict[str, int] | None = None,
    outbox: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The snapshot from what was read; pure, so it is tested without Redis.

    ``tools`` maps a tool to its counts per state and, per non-terminal state,
    the (ref, entered-ms) of its oldest operation; ``due`` is (backlog, due now,
    earliest due ms); ``schedulers`` maps a scheduler id to its last beat (ms);
    ``worker_beats`` a queue to the last beat of any worker on it (ms);
    ``outbox`` (outbox mode only) what :func:`toolq.ledger.outbox.parse_status` read,
    and ``unacked`` is then None (the broker's own to count).
    """
    per_tool: dict[str, Any] = {}
    totals = dict.fromkeys(STATES, 0)
    total_oldest: dict[str, dict[str, Any]] = {}
    counted: dict[str, dict[str, int]] = {}
    for key, n in stats.items():
        tool, _, name = key.partition("|")
        counted.setdefault(tool, {})[name] = n
    for tool, (counts, oldest) in tools.items():
        counters = {**dict.fromkeys(COUNTERS, 0), **counted.get(tool, {})}
        aged = {state: _aged(ref, since, now_ms) for state, (ref, since) in oldest.items()}
        per_tool[tool] = {
            "states": dict(counts),
            "pending_recovery": sum(counts[s] for s in PENDING),
            "oldest": aged,
            "counters": counters,
        }
        for state, n in counts.items():
            totals[state] = totals.get(state, 0) + n
        for state, item in aged.items():
            if state not in total_oldest or item["age_s"] > total_oldest[state]["age_s"]:
                total_oldest[state] = {"tool": tool, **item}
    backlog, due_now, next_due = due
    beats = worker_beats or {}
    instances = [
        {"id": sid, "last_beat_ms": beat, "age_s": _secs(now_ms - beat),
         "alive": now_ms - beat <= SCHEDULER_ALIVE_MS}
        for sid, beat in sorted(schedulers.items())
    ]  # fmt: skip
    snap: dict[str, Any] = {
        "at": _iso(now_ms),
        "now_ms": now_ms,
        "prefix": prefix,
        "tools": per_tool,
        "totals": {
            "states": totals,
            "pending_recovery": sum(totals[s] for s in PENDING),
            "oldest": total_oldest,
        },
        "queues": {
            "depth": dict(queues),
            "unacked": unacked,
            # every queue read, and any other a worker beats for
            "workers": {q: _beat(beats.get(q), now_ms) for q in sorted(set(queues) | set(beats))},
        },
        "scheduler": {
            "backlog": backlog,
            "due_now": due_now,
            "next_due_ms": next_due,
            "next_due_in_s": None if next_due is None else _secs(next_due - now_ms),
            "live": sum(1 for i in instances if i["alive"]),
            "instances": instances,
        },
    }
    if outbox is not None:
        snap["outbox"] = outbox
    return snap


def shape_workers(nodes: Iterable[WorkerNode], now_ms: int) -> dict[str, Any]:
    """The workers as their heartbeats tell: every entry, and which are live. Pure."""
    shown = [
        {
            "node": n.node,
            "pid": n.pid,
            "pool": n.pool,
            "concurrency": n.concurrency,
            "queues": list(n.queues),
            "started_ms": n.started_ms,
            "last_beat_ms": n.beat_ms,
            "age_s": _secs(max(0, now_ms - n.beat_ms)),
            "alive": now_ms - n.beat_ms <= ALIVE_MS,
            "waiting": n.waiting,
        }
        for n in nodes
    ]
    names = [w["node"] for w in shown if w["alive"]]
    return {"checked": True, "source": "heartbeats", "live": len(names), "names": names,
            "nodes": shown}  # fmt: skip


def _beat(beat_ms: int | None, now_ms: int) -> dict[str, Any]:
    """A queue's last worker heartbeat: when, and whether that counts as live."""
    if beat_ms is None:
        return {"last_beat_ms": None, "age_s": None, "alive": False}
    age = now_ms - beat_ms
    return {"last_beat_ms": beat_ms, "age_s": _secs(max(0, age)), "alive": age <= ALIVE_MS}


def _aged(ref: str, since_ms: int, now_ms: int) -> dict[str, Any]:
    return {"ref": ref, "since": _iso(since_ms), "age_s": _secs(max(0, now_ms - since_ms))}


def _secs(ms: int) -> float:
    return round(ms / 1000, 3)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- the console's


async def aread_status(
    client: aioredis.Redis, sources: Sources, *, now_ms: int, tools_hint: Iterable[str] = ()
) -> dict[str, Any]:
    """:func:`read_status` on ``redis.asyncio``, with the overview's extra reads in the
    same pipeline: each tool's oldest escalated operation and the last hour's samples."""
    guess = sorted(set(tools_hint))
    fields = samples.series_fields(now_ms, 1.0)
    async with client.pipeline(transaction=False) as pipe:
        _queue_common(pipe, sources, now_ms)
        pipe.hmget(sources.keys.series, [str(f) for f in fields])
        for tool in guess:
            _queue_tool(pipe, sources, tool)
            _queue_escalated(pipe, sources, tool)
        replies = iter(await pipe.execute())
    common = _parse_common(replies, sources, now_ms)
    sampled = [samples.parse_sample(raw) for raw in next(replies)]
    per_tool, escalated = {}, {}
    for tool in guess:
        per_tool[tool] = _parse_tool(replies, sources)
        escalated[tool] = _parse_escalated(replies, sources)
    ledger_tools = _ledger_tools(common)
    missing = sorted(ledger_tools - set(guess))
    if missing:
        async with client.pipeline(transaction=False) as pipe:
            for tool in missing:
                _queue_tool(pipe, sources, tool)
                _queue_escalated(pipe, sources, tool)
            more = iter(await pipe.execute())
        for tool in missing:
            per_tool[tool] = _parse_tool(more, sources)
            escalated[tool] = _parse_escalated(more, sources)
    snap = _shape_read(common, per_tool, ledger_tools, sources, now_ms)
    snap["workers"] = shape_workers(common["nodes"], now_ms)
    snap["waiting"] = waiting(snap, now_ms)
    oldest_escalated = {
        t: (_s(first[0][0]), int(first[0][1])) for t, first in escalated.items() if first
    }
    return shape_overview(snap, oldest_escalated, samples.points(sampled), now_ms)


def shape_overview(
    snap: dict[str, Any],
    oldest_escalated: dict[str, tuple[str, int]],
    recent: list[Point],
    now_ms: int,
) -> dict[str, Any]:
    """The status snapshot plus what the console's overview shows first. Pure.

    ``pending``: per state of :data:`RECOVERY`, how many and the oldest (tool,
    ref, age); ``scheduler.lag_s``: how late the earliest due item is;
    ``rates``: operations per minute over the last 5 and 60 minutes of samples.
    """
    tools: dict[str, Any] = snap["tools"]
    totals = snap["totals"]
    pending: dict[str, Any] = {}
    for state in RECOVERY:
        oldest = totals["oldest"].get(state)
        if state == State.ESCALATED.value:
            first = min(oldest_escalated.items(), key=lambda kv: kv[1][1], default=None)
            oldest = None if first is None else {"tool": first[0], **_aged(*first[1], now_ms)}
        pending[state] = {"count": totals["states"].get(state, 0), "oldest": oldest}
    next_due = snap["scheduler"]["next_due_ms"]
    lag = 0.0 if next_due is None or next_due >= now_ms else _secs(now_ms - next_due)
    return {
        **snap,
        "pending": pending,
        "scheduler": {**snap["scheduler"], "lag_s": lag},
        "rates": {"last_5m": _rates(recent, now_ms, 5), "last_60m": _rates(recent, now_ms, 60)},
        "tools_count": len(tools),
    }


def _rates(recent: list[Point], now_ms: int, minutes: int) -> dict[str, float | None]:
    """Per minute, over the points of the last ``minutes`` (None: no samples yet)."""
    since = now_ms - minutes * 60_000
    window = [p for p in recent if p.at_ms > since and p.interval_ms > 0]
    span_ms = sum(p.interval_ms for p in window)
    if not span_ms:
        return dict.fromkeys(samples.COUNTED)
    return {
        name: round(sum(p.counts.get(name, 0) for p in window) * 60_000 / span_ms, 2)
        for name in samples.COUNTED
    }


async def overview(aio: AsyncToolQueue) -> dict[str, Any]:
    """What the console's overview shows, as a JSON-able dict: the status snapshot
    (:func:`status_snapshot`'s keys, workers from their heartbeats) plus ``pending``,
    ``scheduler.lag_s`` and ``rates`` (:func:`shape_overview`). Two round trips at
    most, none a broadcast."""
    app = aio.app
    hint = frozenset(t.name for t in app.registry) | app.seen_tools
    client = await aio.client()
    sources = settings_sources(aio.app.settings)
    snap = await aread_status(client, sources, now_ms=app.now_ms(), tools_hint=hint)
    app.seen_tools = frozenset(snap["tools"])
    depths = broker_depths(aio.app.settings)
    if depths is not None:  # outbox mode: the queues are the broker's (kombu is sync)
        read = await asyncio.to_thread(depths, sources.queues)
        snap["queues"]["depth"] = {q: n for q, n in read.items() if n is not None}
    return snap


async def series(aio: AsyncToolQueue, hours: float) -> list[Point]:
    """The chart's points for the last ``hours`` (at most a day), oldest first; one
    ``HMGET``. Empty while no scheduler has sampled."""
    if not (isinstance(hours, int | float) and math.isfinite(hours)) or not (
        0 < hours <= MAX_SERIES_HOURS
    ):
        # here: ``toolq status`` imports this module, and the contract's models cost 30 ms
        from toolq import errors
        from toolq.envelope import FieldError

        raise errors.InvalidArguments(
            "hours out of range",
            field_errors=[
                FieldError(field="hours", rule=f"more than 0, at most {MAX_SERIES_HOURS:g}")
            ],
        )
    now = aio.app.now_ms()
    fields = samples.series_fields(now, float(hours))
    client = await aio.client()
    raw = await client.hmget(
        settings_sources(aio.app.settings).keys.series, [str(f) for f in fields]
    )
    found = samples.points([samples.parse_sample(r) for r in raw])
    return [p for p in found if p.at_ms > fields[0]]


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
