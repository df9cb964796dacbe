"""Prometheus metrics: ``toolq up``, ``toolq worker --metrics-port`` and
``toolq scheduler --metrics-port`` serve them.

Two kinds of series:

* **Cluster-wide, read from the ledger at scrape time** by a custom collector
  (one :func:`~toolq.edges.monitor.status_snapshot` without the worker ping: one
  Redis round trip whatever the number of operations). Every process serves
  the same numbers, so aggregate them with ``max``, not ``sum``:

  - ``toolq_operations{tool,state}`` (gauge) and
    ``toolq_pending_recovery_oldest_seconds{tool,state}`` (gauge, 0 when empty)
  - counters from the ledger's stats hash: ``toolq_operations_submitted_total``,
    ``toolq_attempts_total``, ``toolq_operations_finished_total{state}``
    (succeeded, failed, cancelled), ``toolq_escalations_total``, ``toolq_unknown_outcomes_total``,
    ``toolq_unverifiable_unknowns_total``,
    ``toolq_verification_verdicts_total{verdict}``,
    ``toolq_duplicates_prevented_total``, ``toolq_leases_lost_total``,
    ``toolq_dispatches_total{kind}``, ``toolq_duplicate_submits_total``,
    ``toolq_operator_resolutions_total{resolution}`` (all labelled by ``tool``), and
    ``toolq_ledger_events_total{tool,event}`` for counters not named here
  - ``toolq_recovery_seconds{tool,state}`` (histogram): the time operations spent in
    each pending-recovery state, counted by the ledger's APPLY when they left it
    (:mod:`toolq.core.stats`), so it covers every process
  - ``toolq_queue_messages{queue}``, ``toolq_queue_unacked_messages``,
    ``toolq_scheduler_backlog``, ``toolq_scheduler_due``,
    ``toolq_scheduler_overdue_seconds``, ``toolq_schedulers_live``,
    ``toolq_ledger_up`` and ``toolq_ledger_read_seconds``; in outbox mode
    (a broker URL) ``toolq_outbox_messages``, ``toolq_outbox_oldest_seconds``,
    ``toolq_relays_live`` and ``toolq_relay_lag_seconds``, and the queue depths
    read from the broker (``toolq_queue_unacked_messages`` is the broker's own)
  - per dependency key (label ``dependency``; one more round trip, only when the
    ledger has keys): ``toolq_dependency_in_flight``, ``toolq_dependency_waiting``,
    ``toolq_dependency_paused`` (0/1), ``toolq_dependency_breaker_state`` (0 closed,
    1 half-open, 2 open), ``toolq_dependency_admitted_total`` and
    ``toolq_dependency_limited_total``. A key per account is a series per account:
    keep such keys few, or drop the label at the scrape

* **Per process, observed where the event happens**:

  - ``toolq_scheduler_dispatch_lag_seconds`` (histogram) and
    ``toolq_scheduler_actions_total{action}``: fed by :func:`observe_tick`, the
    scheduler's ``on_tick`` callback, so they live in the scheduler process.
  - ``toolq_pending_recovery_seconds{tool,state}`` (histogram): fed by
    :func:`observe_recovery` wherever an operation leaves a pending-recovery
    state, and by :func:`observe_tick` for what a scheduler batch moved out
    of one (``TickStats.recovered``, when the scheduler reports it). In a
    prefork worker the metrics server runs in the main process and tasks run
    in pool children: what a child observes never reaches the server (use
    ``--pool threads``, or observe in the scheduler).
  - ``toolq_process_info{role,version}``, and prometheus_client's process and
    GC collectors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import REGISTRY, CollectorRegistry, Info, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from toolq.adapters import observe
from toolq.adapters.observe import observe_recovery
from toolq.core.deps import DepView
from toolq.core.errors import ToolqError
from toolq.core.stats import RECOVERY_STATES, SUM, cumulative
from toolq.edges.monitor import PENDING, status_snapshot

__all__ = [
    "LedgerCollector",
    "MetricsServer",
    "dep_metrics",
    "observe_recovery",
    "observe_tick",
    "snapshot_metrics",
    "start_metrics_server",
]

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from toolq.client.queue import ToolQueue
    from toolq.services.scheduler.service import TickStats

METRICS_HOST_ENV = "TOOLQ_METRICS_HOST"
DEFAULT_METRICS_HOST = "127.0.0.1"

PROCESS_INFO = Info("toolq_process", "The toolq process serving these metrics.")

# stats-hash counter -> (metric, help, extra label name, its value)
_COUNTERS: dict[str, tuple[str, str, str, str]] = {
    "submitted": ("toolq_operations_submitted", "Operations created.", "", ""),
    "attempts": ("toolq_attempts", "Attempts dispatched, first ones included.", "", ""),
    "succeeded": ("toolq_operations_finished", "Operations finished, by state.", "state",
                  "succeeded"),
    "failed": ("toolq_operations_finished", "", "state", "failed"),
    "cancelled": ("toolq_operations_finished", "", "state", "cancelled"),
    "escalated": ("toolq_escalations", "Operations escalated to a human.", "", ""),
    "unknown": ("toolq_unknown_outcomes", "Attempts whose outcome was unknown.", "", ""),
    "no_verifier": ("toolq_unverifiable_unknowns",
                    "Unknown outcomes escalated because the tool has no verifier.", "", ""),
    "verify_found": ("toolq_verification_verdicts", "Verification checks, by verdict.",
                     "verdict", "found"),
    "verify_not_found": ("toolq_verification_verdicts", "", "verdict", "not_found"),
    "verify_recheck": ("toolq_verification_verdicts", "", "verdict", "recheck"),
    "verify_failed": ("toolq_verification_verdicts", "", "verdict", "lookup_failed"),
    "verify_escalated": ("toolq_verification_verdicts", "", "verdict", "escalated"),
    "duplicates_prevented": ("toolq_duplicates_prevented",
                             "Deliveries refused because the attempt was claimed or done.", "",
                             ""),
    "lease_lost": ("toolq_leases_lost", "Attempts whose lease expired.", "", ""),
    "dispatched": ("toolq_dispatches", "Messages the scheduler published, by kind.", "kind",
                   "dispatch"),
    "republished": ("toolq_dispatches", "", "kind", "republish"),
    "verify_published": ("toolq_dispatches", "", "kind", "verify"),
    "duplicate_submits": ("toolq_duplicate_submits", "Submits of an existing operation (same "
                          "ref, same arguments) answered for it instead of creating another.",
                          "", ""),
    "resolved_committed": ("toolq_operator_resolutions",
                           "Escalated operations an operator resolved, by resolution.",
                           "resolution", "committed"),
    "resolved_not_committed": ("toolq_operator_resolutions", "", "resolution", "not_committed"),
    "resolved_retry": ("toolq_operator_resolutions", "", "resolution", "retry"),
}  # fmt: skip
_OTHER_COUNTER = ("toolq_ledger_events", "Other ledger counters, by name.", "event")


def observe_tick(stats: TickStats) -> None:
    """The scheduler's ``on_tick`` callback: dispatch lags and actions of one batch."""
    observe.observe_tick(stats.lags_ms, stats.actions, stats.recovered)


class LedgerCollector(Collector):
    """Reads the cluster-wide series from the ledger at every scrape."""

    def __init__(self, tq: ToolQueue | None = None) -> None:
        self.tq = tq
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked: the families depend on what the ledger holds

    def collect(self) -> Iterator[Metric]:
        if self.tq is None:
            return
        up = GaugeMetricFamily("toolq_ledger_up", "Whether the last ledger read succeeded.")
        started = time.perf_counter()
        try:
            with self._lock:  # concurrent scrapes share nothing but the connection pool
                snap = status_snapshot(self.tq, workers=False)
        except (redis.RedisError, OSError, ToolqError):
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily("toolq_ledger_read_seconds", "How long the ledger read took.")
        took.add_metric([], time.perf_counter() - started)
        yield took
        yield from snapshot_metrics(snap)
        try:
            views = self.tq.deps.list()
        except (redis.RedisError, OSError, ToolqError):
            return
        yield from dep_metrics(views)


#: ``toolq_dependency_breaker_state``'s values.
BREAKER_VALUES = {"closed": 0, "half_open": 1, "open": 2}


def dep_metrics(views: Iterable[DepView]) -> Iterator[Metric]:
    """The families of each dependency key (pure)."""
    label = ["dependency"]
    gauges = {
        "in_flight": GaugeMetricFamily(
            "toolq_dependency_in_flight", "Calls holding one of the key's slots.", labels=label
        ),
        "waiting": GaugeMetricFamily(
            "toolq_dependency_waiting", "Calls the key holds back.", labels=label
        ),
        "paused": GaugeMetricFamily(
            "toolq_dependency_paused", "Whether the key's shared backoff runs (0/1).", labels=label
        ),
        "breaker": GaugeMetricFamily(
            "toolq_dependency_breaker_state",
            "The key's breaker: 0 closed, 1 half-open, 2 open.",
            labels=label,
        ),
    }
    admitted = CounterMetricFamily(
        "toolq_dependency_admitted", "Calls the key's limiter let through.", labels=label
    )
    limited = CounterMetricFamily(
        "toolq_dependency_limited", "Calls the key's limiter held back.", labels=label
    )
    for v in views:
        gauges["in_flight"].add_metric([v.key], v.in_flight)
        gauges["waiting"].add_metric([v.key], v.waiting)
        gauges["paused"].add_metric([v.key], 0 if v.paused_until_ms is None else 1)
        gauges["breaker"].add_metric([v.key], BREAKER_VALUES[v.breaker])
        admitted.add_metric([v.key], v.admitted)
        limited.add_metric([v.key], v.limited)
    yield from gauges.values()
    yield admitted
    yield limited


def snapshot_metrics(snap: dict[str, Any]) -> Iterator[Metric]:
    """The cluster-wide families of one status snapshot (pure)."""
    ops = GaugeMetricFamily("toolq_operations", "Operations by tool and state.",
                            labels=["tool", "state"])  # fmt: skip
    oldest = GaugeMetricFamily(
        "toolq_pending_recovery_oldest_seconds",
        "Age of the oldest operation in each pending-recovery state (0 when none).",
        labels=["tool", "state"],
    )
    families: dict[str, CounterMetricFamily] = {}
    recovery = HistogramMetricFamily(
        "toolq_recovery_seconds",
        "Time operations spent in each pending-recovery state, counted by the ledger when "
        "they left it (every process serves the same: aggregate with max).",
        labels=["tool", "state"],
    )
    for tool, t in snap["tools"].items():
        times = t.get("recovery_ms", {})
        for state in RECOVERY_STATES:
            buckets = times.get(state, {})
            recovery.add_metric(
                [tool, state], cumulative(buckets), sum_value=buckets.get(SUM, 0) / 1000
            )
        for state, n in t["states"].items():
            ops.add_metric([tool, state], n)
        for state in PENDING:
            item = t["oldest"].get(state)
            oldest.add_metric([tool, state], item["age_s"] if item else 0.0)
        for counter, n in t["counters"].items():
            name, doc, label, value = _COUNTERS.get(counter, (*_OTHER_COUNTER, counter))
            if name not in families:
                labels = ["tool", label] if label else ["tool"]
                doc = doc or _doc_of(name)
                families[name] = CounterMetricFamily(name, doc, labels=labels)
            families[name].add_metric([tool, value] if label else [tool], n)
    yield ops
    yield oldest
    yield recovery
    yield from families.values()
    queues, sched = snap["queues"], snap["scheduler"]
    depth = GaugeMetricFamily("toolq_queue_messages", "Messages waiting in a broker queue.",
                              labels=["queue"])  # fmt: skip
    for queue, n in queues["depth"].items():
        depth.add_metric([queue], n)
    yield depth
    if queues["unacked"] is not None:  # None in outbox mode: the broker's own to count
        yield _gauge("toolq_queue_unacked_messages",
                     "Messages delivered to a worker and not acknowledged yet (all queues).",
                     queues["unacked"])  # fmt: skip
    box = snap.get("outbox")
    if box is not None:
        yield _gauge("toolq_outbox_messages", "Messages in the ledger's outbox, not yet "
                     "published and deleted by a relay.", box["entries"])  # fmt: skip
        oldest = box["oldest_age_ms"]
        yield _gauge("toolq_outbox_oldest_seconds", "Age of the oldest message in the outbox "
                     "(0: empty).", (oldest or 0) / 1000)  # fmt: skip
        yield _gauge("toolq_relays_live", "Relays with a recent heartbeat.", box["relays"])
        lag = box["lag_ms"]
        yield _gauge("toolq_relay_lag_seconds", "How long the relays' latest batch waited "
                     "in the outbox (the largest of the live relays').",
                     (lag or 0) / 1000)  # fmt: skip
    yield _gauge("toolq_scheduler_backlog", "Operations in the scheduler's due set.",
                 sched["backlog"])  # fmt: skip
    yield _gauge("toolq_scheduler_due", "Operations due now.", sched["due_now"])
    next_in = sched["next_due_in_s"]
    yield _gauge("toolq_scheduler_overdue_seconds", "How late the earliest due operation is.",
                 max(0.0, -next_in) if next_in is not None else 0.0)  # fmt: skip
    yield _gauge("toolq_schedulers_live", "Schedulers with a heartbeat in the last 15 s.",
                 sched["live"])  # fmt: skip


def _doc_of(name: str) -> str:
    return next(doc for n, doc, _, _ in _COUNTERS.values() if n == name and doc)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


# --------------------------------------------------------------------------- the server


@dataclass
class MetricsServer:
    """A running metrics endpoint; :meth:`shutdown` stops it (tests, ``toolq up``)."""

    host: str
    port: int
    tq: ToolQueue
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _ProcessSeries(Collector):
    """This process's own series (prometheus_client's default registry)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def start_metrics_server(port: int, tq: ToolQueue, role: str) -> MetricsServer:
    """Serve ``/metrics`` on ``port`` from a daemon thread.

    Binds to ``TOOLQ_METRICS_HOST`` (default 127.0.0.1; set ``0.0.0.0`` in a
    container). Each server has a registry of its own: the ledger collector
    reading through ``tq``, and this process's series. ``port=0`` picks a free
    port (see the returned handle).
    """
    host = os.environ.get(METRICS_HOST_ENV) or DEFAULT_METRICS_HOST
    PROCESS_INFO.info({"role": role, "version": _version()})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(tq))
    registry.register(_ProcessSeries())
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ToolqError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    return MetricsServer(host, int(server.server_address[1]), tq, server, thread)


def _version() -> str:
    try:
        return version("toolq")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"
