"""The status snapshot and the console's overview, shaped from what was read. Pure:
tested without Redis (:mod:`toolq.edges.monitor.read` reads, :mod:`toolq.edges.monitor` puts
them together)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from toolq.adapters.liveness import ALIVE_MS, WorkerNode
from toolq.core.states import PENDING_RECOVERY, TERMINAL, State
from toolq.core.stats import is_recovery_field, recovery_of
from toolq.services.scheduler import series as samples
from toolq.services.scheduler.series import Point

STATES: tuple[str, ...] = tuple(str(s) for s in State)
PENDING: tuple[str, ...] = tuple(str(s) for s in PENDING_RECOVERY)
#: States whose oldest operation's age is reported (finished ones do not age).
AGED: tuple[str, ...] = tuple(str(s) for s in State if s not in TERMINAL)
#: A scheduler whose last heartbeat is older than this is not counted as live
#: (the same window as a worker's: toolq.adapters.liveness.ALIVE_MS).
SCHEDULER_ALIVE_MS = ALIVE_MS
#: Counters every tool reports, 0 when the ledger has not counted one yet.
COUNTERS: tuple[str, ...] = (
    "submitted", "attempts", "succeeded", "failed", "escalated", "cancelled", "unknown",
    "no_verifier", "verify_found", "verify_not_found", "verify_recheck", "verify_failed",
    "verify_escalated", "verify_published", "duplicates_prevented", "lease_lost",
    "republished", "dispatched", "retried_now", "verified_now",
    "duplicate_submits", "resolved_committed", "resolved_not_committed", "resolved_retry",
)  # fmt: skip
#: What the console's overview lists as waiting on recovery, or on a person.
RECOVERY: tuple[str, ...] = (*PENDING, State.ESCALATED.value)


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
    alive_ms: int = ALIVE_MS,
) -> dict[str, Any]:
    """The snapshot from what was read; pure, so it is tested without Redis.

    ``tools`` maps a tool to its counts per state and, per non-terminal state,
    the (ref, entered-ms) of its oldest operation; ``due`` is (backlog, due now,
    earliest due ms); ``schedulers`` maps a scheduler id to its last beat (ms);
    ``worker_beats`` a queue to the last beat of any worker on it (ms);
    ``outbox`` (outbox mode only) what :func:`toolq.adapters.ledger.outbox.parse_status` read,
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
        mine = counted.get(tool, {})
        counters = {**dict.fromkeys(COUNTERS, 0)}
        counters.update((k, n) for k, n in mine.items() if not is_recovery_field(k))
        aged = {state: _aged(ref, since, now_ms) for state, (ref, since) in oldest.items()}
        per_tool[tool] = {
            "states": dict(counts),
            "pending_recovery": sum(counts[s] for s in PENDING),
            "oldest": aged,
            "counters": counters,
            # time spent in each pending-recovery state: the ledger's buckets (toolq.core.stats)
            "recovery_ms": recovery_of(mine),
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
            "workers": {
                q: _beat(beats.get(q), now_ms, alive_ms) for q in sorted(set(queues) | set(beats))
            },
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


def shape_workers(
    nodes: Sequence[WorkerNode], now_ms: int, alive_ms: int = ALIVE_MS
) -> dict[str, Any]:
    """The workers as their heartbeats tell. Pure.

    ``nodes``: the live ones (a beat at most ``alive_ms`` old); ``gone``: the others,
    since their last beat, unless a live worker of the same node name replaced them
    (a restart), so that a dead worker leaves the live list and does not linger beside
    its successor."""
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
            "alive": now_ms - n.beat_ms <= alive_ms,
            "waiting": n.waiting,
        }
        for n in nodes
    ]
    live = [w for w in shown if w["alive"]]
    names = [w["node"] for w in live]
    gone = [
        {**w, "gone_since": _iso(n.beat_ms)}
        for n, w in zip(nodes, shown, strict=True)
        if not w["alive"] and w["node"] not in names
    ]
    return {"checked": True, "source": "heartbeats", "live": len(names), "names": names,
            "nodes": live, "gone": gone}  # fmt: skip


def _beat(beat_ms: int | None, now_ms: int, alive_ms: int) -> dict[str, Any]:
    """A queue's last worker heartbeat: when, and whether that counts as live."""
    if beat_ms is None:
        return {"last_beat_ms": None, "age_s": None, "alive": False}
    age = now_ms - beat_ms
    return {"last_beat_ms": beat_ms, "age_s": _secs(max(0, age)), "alive": age <= alive_ms}


def _aged(ref: str, since_ms: int, now_ms: int) -> dict[str, Any]:
    return {"ref": ref, "since": _iso(since_ms), "age_s": _secs(max(0, now_ms - since_ms))}


def _secs(ms: int) -> float:
    return round(ms / 1000, 3)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def shape_overview(
    snap: dict[str, Any],
    oldest_escalated: dict[str, tuple[str, int]],
    recent: list[Point],
    now_ms: int,
) -> dict[str, Any]:
    """The status snapshot plus what the console's overview shows first. Pure.

    ``pending``: per state of :data:`RECOVERY`, how many and the oldest (tool,
    ref, age); ``scheduler.lag_s``: how late the earliest due item is;
    ``rates``: operations per minute over the last 5 and 60 minutes (count / window).
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
        "rates": rates(recent, now_ms),
        "tools_count": len(tools),
    }


def rates(recent: list[Point], now_ms: int) -> dict[str, dict[str, float | None]]:
    """Operations per minute over the last 5 and 60 minutes (count / window). Pure."""
    return {"last_5m": _rates(recent, now_ms, 5), "last_60m": _rates(recent, now_ms, 60)}


def _rates(recent: list[Point], now_ms: int, minutes: int) -> dict[str, float | None]:
    """Per minute over the last ``minutes``: the counts of the points in it over the
    window (None: no samples yet). A stack younger than the window had nothing
    before it: those minutes count as none, they do not shorten the window."""
    since = now_ms - minutes * 60_000
    window = [p for p in recent if p.at_ms > since and p.interval_ms > 0]
    span_ms = sum(p.interval_ms for p in window)
    if not span_ms:
        return dict.fromkeys(samples.COUNTED)
    return {
        name: per_minute(sum(p.counts.get(name, 0) for p in window), minutes, span_ms)
        for name in samples.COUNTED
    }


def per_minute(count: int, minutes: float, span_ms: int) -> float:
    """``count`` per minute over a window of ``minutes``: count / window, whatever part
    of it the samples cover; over the samples' span if it is longer (a sample missed
    at the window's start makes the first point cover more than its minute). Pure."""
    return round(count * 60_000 / max(span_ms, minutes * 60_000), 2)
