"""Per-process observations the services make where an event happens.

The series live in prometheus_client's default registry; the metrics server
(:mod:`toolq.edges.metrics`, an edge) serves them with the cluster-wide ones it reads
from the ledger. Observing costs nothing when no server runs.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

PENDING_RECOVERY_SECONDS = Histogram(
    "toolq_pending_recovery_seconds",
    "Time an operation spent in a pending-recovery state, observed when it left it.",
    ["tool", "state"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400, float("inf")),
)
DISPATCH_LAG_SECONDS = Histogram(
    "toolq_scheduler_dispatch_lag_seconds",
    "Publish time minus due time of each dispatch, republish and verification (this scheduler).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf")),
)
SCHEDULER_ACTIONS = Counter(
    "toolq_scheduler_actions",
    "Decisions this scheduler took on due operations, by action.",
    ["action"],
)


def observe_recovery(tool: str, seconds: float, state: str = "") -> None:
    """Record that an operation of ``tool`` left ``state`` after ``seconds`` in it."""
    PENDING_RECOVERY_SECONDS.labels(tool=tool, state=state).observe(max(0.0, seconds))


def observe_tick(
    lags_ms: list[int], actions: dict[str, int], recovered: list[tuple[str, str, int]]
) -> None:
    """What one scheduler batch did: dispatch lags, actions, and what left pending recovery."""
    for lag_ms in lags_ms:
        DISPATCH_LAG_SECONDS.observe(max(0, lag_ms) / 1000)
    for action, n in actions.items():
        SCHEDULER_ACTIONS.labels(action=str(action)).inc(n)
    for tool, state, ms in recovered:
        observe_recovery(tool, ms / 1000, state=state)
