"""What a toolq deployment is doing now, read from indexes only.

:func:`status_snapshot` answers with counts per tool and state, the age of the
oldest operation in every non-terminal state, the broker's queue depths, the
scheduler's backlog and heartbeats, each queue's last worker heartbeat and
every worker's own (:mod:`toolq.adapters.liveness`), and the ledger's counters.
Every number comes from a key whose name is known in advance (``ZCARD`` and
``ZRANGE 0 0`` of the per-tool-per-state indexes, ``LLEN`` of the queue lists,
``HLEN`` of kombu's ``unacked`` hash, ...), all sent in one pipeline: the cost
grows with the number of tools, not of operations, and the keyspace is never
scanned. Counts of finished states cover the retention window (the scheduler
trims older index entries). Live workers are the ones whose heartbeat is
recent: no Celery broadcast, whose ping waits out its timeout (``toolq status
--ping`` still asks for one).

The snapshot is a plain JSON-able dict: ``toolq status --json`` prints it and
the HTTP API's ``GET /v1/status`` returns it. :func:`toolq.edges.cli.monitor.render_status`
turns it into the table ``toolq status`` shows.

:func:`overview` is the console's: the snapshot, read on ``tq.aio``, plus the
pending-recovery summary, the scheduler's lag, each worker and the recent
rates; :func:`series` is its chart (:mod:`toolq.services.scheduler.series`);
:func:`trust` the trust figures per tool over 1 h, 24 h or 7 d
(:mod:`toolq.services.scheduler.trust`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolq.edges.monitor.console import MAX_SERIES_HOURS, aread_status, overview, series, trust
from toolq.edges.monitor.read import (
    Backlog,
    BrokerDepths,
    Outboxes,
    QueueLists,
    Sources,
    WorkerProbe,
    broker_depths,
    read_status,
    settings_sources,
)
from toolq.edges.monitor.shape import (
    AGED,
    COUNTERS,
    PENDING,
    RECOVERY,
    SCHEDULER_ALIVE_MS,
    STATES,
    shape,
    shape_overview,
    shape_workers,
    waiting,
)

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

__all__ = [
    "AGED",
    "COUNTERS",
    "MAX_SERIES_HOURS",
    "PENDING",
    "RECOVERY",
    "SCHEDULER_ALIVE_MS",
    "STATES",
    "Backlog",
    "BrokerDepths",
    "Outboxes",
    "QueueLists",
    "Sources",
    "WorkerProbe",
    "aread_status",
    "broker_depths",
    "overview",
    "ping_workers",
    "read_status",
    "series",
    "settings_sources",
    "shape",
    "shape_overview",
    "shape_workers",
    "status_snapshot",
    "trust",
    "waiting",
]


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
