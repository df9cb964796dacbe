"""What the console's pages show, shaped from records (pure: no I/O, no templates).

Arguments are shown as every output shows them (:func:`toolq.core.redact.shown_args`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from toolq.core import why
from toolq.core.envelope import ToolError, ToolSuccess, to_dict
from toolq.core.record import HistoryEntry, OperationRecord, ms_to_dt
from toolq.core.redact import scrub, shown_args
from toolq.core.states import PENDING_RECOVERY, SETTLED, TERMINAL, State

#: The states each list page is for, in the order the navigation shows them.
LIST_STATES: tuple[State, ...] = (
    *PENDING_RECOVERY,
    State.ESCALATED,
    State.QUEUED,
    State.RUNNING,
    State.FAILED,
    State.SUCCEEDED,
    State.CANCELLED,
)

#: What each state means, in a few words (the pages never rely on colour alone).
STATE_HELP: dict[State, str] = {
    State.QUEUED: "waiting for a worker",
    State.RUNNING: "a worker is running an attempt",
    State.WAITING_RETRY: "waiting for its retry time",
    State.NEEDS_INPUT: "needs corrected arguments",
    State.AWAITING_APPROVAL: "needs an operator's approval",
    State.VERIFYING: "outcome unknown: checking whether the write happened",
    State.SUCCEEDED: "done, committed",
    State.FAILED: "failed for good",
    State.ESCALATED: "given up on: needs a person",
    State.CANCELLED: "cancelled",
}


# --------------------------------------------------------------------------- arguments


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def envelope_json(env: ToolSuccess | ToolError | None) -> str | None:
    """The envelope as JSON (already redacted: an envelope cannot hold a secret)."""
    return None if env is None else as_json(to_dict(env))


# --------------------------------------------------------------------------- the timeline


@dataclass(frozen=True)
class Step:
    """One transition as the timeline shows it."""

    index: int
    at_ms: int
    at: str
    offset: str
    from_: str
    to: str
    attempt: int
    by: str
    code: str
    #: A verification check's verdict in a few words ("check 2: unavailable"), or "".
    note: str = ""


def timeline(history: list[HistoryEntry]) -> list[Step]:
    start = history[0].at if history else 0
    return [
        Step(
            index=i,
            at_ms=h.at,
            at=clock_time(h.at_time),
            offset=f"+{(h.at - start) / 1000:.3f} s",
            from_=str(h.from_) if h.from_ is not None else "",
            to=str(h.to),
            attempt=h.attempt,
            by=scrub(h.by)[:120],
            code=h.code or "",
            note=_note(h),
        )
        for i, h in enumerate(history, 1)
    ]


def _note(h: HistoryEntry) -> str:
    result = h.note.get("result")
    if not result:
        return ""
    return f"check {h.note.get('check', '?')}: {result.replace('_', ' ')}"


@dataclass(frozen=True)
class Check:
    """One verification check: when, which, for which attempt, what it found."""

    index: int
    at: str
    number: int
    attempt: int
    outcome: str
    detail: str
    by: str


@dataclass(frozen=True)
class Verification:
    """The page's "Verification" section (:func:`toolq.core.why.verification`)."""

    checks_made: int
    failed: int
    next_check_ms: int | None
    next_check_at: str
    window_end_ms: int | None
    window_end_at: str
    checks: list[Check]


def checks(rec: OperationRecord) -> Verification | None:
    """The verification checks made, and the next one: from the record and its history."""
    v = why.verification(rec)
    if v is None:
        return None
    rows = [
        Check(
            index=c.index,
            at=clock_time(ms_to_dt(c.at_ms)),
            number=c.check,
            attempt=c.attempt,
            outcome=c.words,
            detail="" if c.detail and c.detail in c.words else c.detail,
            by=scrub(c.by)[:120],
        )
        for c in v.checks
    ]
    return Verification(
        checks_made=v.checks_made,
        failed=v.failed,
        next_check_ms=v.next_check_ms,
        next_check_at=_at(v.next_check_ms),
        window_end_ms=v.window_end_ms,
        window_end_at=_at(v.window_end_ms),
        checks=rows,
    )


def _at(ms: int | None) -> str:
    return "" if ms is None else clock_time(ms_to_dt(ms))


# --------------------------------------------------------------------------- the operation


@dataclass(frozen=True)
class OperationDetail:
    """Everything the operation page shows about one record."""

    rec: OperationRecord
    steps: list[Step]
    #: None for an operation that was never verifying.
    verification: Verification | None
    #: While it waits to retry: its last failure and budget; once escalated: why.
    retry: why.RetryWait | None
    escalation: why.Escalation | None
    args_json: str
    envelope_json: str | None
    #: When the scheduler may run it again (epoch ms), while it waits to retry.
    not_before_ms: int | None
    settled: bool
    terminal: bool
    state_help: str


def operation_page(rec: OperationRecord, schema: Mapping[str, Any] | None) -> OperationDetail:
    return OperationDetail(
        rec=rec,
        steps=timeline(rec.history),
        verification=checks(rec),
        retry=why.retry_wait(rec),
        escalation=why.escalation(rec),
        args_json=as_json(shown_args(rec.args, schema)),
        envelope_json=envelope_json(rec.envelope),
        not_before_ms=not_before_ms(rec),
        settled=rec.state in SETTLED,
        terminal=rec.state in TERMINAL,
        state_help=STATE_HELP.get(rec.state, ""),
    )


def not_before_ms(rec: OperationRecord) -> int | None:
    env = rec.envelope
    if rec.state is State.WAITING_RETRY and isinstance(env, ToolError) and env.retry.not_before:
        return int(env.retry.not_before.timestamp() * 1000)
    return None


# --------------------------------------------------------------------------- words for numbers


def clock_time(at: datetime) -> str:
    """``2026-11-30 23:17:01.123 UTC``."""
    return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d} UTC"


def duration(seconds: float | None) -> str:
    """``4 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def until(due_ms: int, now_ms: int) -> str:
    """A countdown's text as the server renders it (the page's script then ticks it)."""
    return f"in {duration(math.ceil((due_ms - now_ms) / 1000))}" if due_ms > now_ms else "due now"


_UNITS = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_AGE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*")


def parse_age(text: str) -> float | None:
    """The "older than" filter: ``90``, ``90s``, ``5m``, ``2h``, ``1d`` (seconds); None if
    empty. ``ValueError`` with the message a person reads for anything else."""
    if not text.strip():
        return None
    match = _AGE.fullmatch(text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise ValueError("write a number of seconds, or like 90s, 5m, 2h, 1d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > 400 * 86400:
        raise ValueError("at most 400 days")
    return seconds


# --------------------------------------------------------------------------- the overview's charts

CHART_W, CHART_H = 720, 160
#: Room for the y-axis labels (left) and the time labels (below).
_PAD_L, _PAD_B = 44, 20


@dataclass(frozen=True)
class Line:
    name: str
    #: ``x,y x,y ...`` in the chart's coordinates.
    points: str
    #: The latest value, and the largest, for the legend.
    last: float
    peak: float


@dataclass(frozen=True)
class Chart:
    title: str
    lines: list[Line]
    y_max: float
    #: (x, label) ticks under the chart.
    ticks: list[tuple[float, str]]
    #: (y, label) lines across it: 0, half and the top.
    grid: list[tuple[float, str]]
    #: The numbers behind the chart (the latest first), for the table beside it.
    rows: list[tuple[str, list[float]]]
    empty: bool
    width: int = CHART_W
    height: int = CHART_H
    left: int = _PAD_L

    @property
    def right(self) -> int:
        return self.width

    @property
    def bottom(self) -> int:
        return self.height - _PAD_B


def chart(
    title: str,
    samples: list[tuple[int, dict[str, float]]],
    names: tuple[str, ...],
    *,
    now_ms: int,
    hours: float,
) -> Chart:
    """A line per name over the last ``hours``: ``samples`` are (at ms, values), oldest first."""
    start = now_ms - int(hours * 3600 * 1000)
    span = max(1, now_ms - start)
    width = CHART_W - _PAD_L
    peak = max([v.get(n, 0.0) for _at, v in samples for n in names] + [0.0])
    y_max = _nice(peak)
    plot_h = CHART_H - _PAD_B

    def xy(at: int, value: float) -> str:
        x = _PAD_L + (at - start) / span * width
        y = plot_h - value / y_max * (plot_h - 6)
        return f"{x:.1f},{y:.1f}"

    lines = [
        Line(
            name,
            " ".join(xy(at, v.get(name, 0.0)) for at, v in samples if at >= start),
            samples[-1][1].get(name, 0.0) if samples else 0.0,
            max([v.get(name, 0.0) for _at, v in samples] + [0.0]),
        )
        for name in names
    ]
    steps = 4
    ticks = [
        (_PAD_L + i / steps * width, _hhmm(start + i * span // steps) if i < steps else "now")
        for i in range(steps + 1)
    ]
    grid = [(round(plot_h - f * (plot_h - 6), 1), f"{y_max * f:g}") for f in (0.0, 0.5, 1.0)]
    rows = [
        (_hhmm(at), [round(v.get(n, 0.0), 2) for n in names]) for at, v in reversed(samples[-15:])
    ]
    return Chart(title, lines, y_max, ticks, grid, rows, empty=not samples)


def _nice(peak: float) -> float:
    """The y axis's top: 1, 2 or 5 times a power of ten, at least the peak (and 1)."""
    top, i = 1.0, 0
    while top < peak:
        top *= (2.0, 2.5, 2.0)[i % 3]  # 1, 2, 5, 10, 20, 50, ...
        i += 1
    return top


def _hhmm(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")


# --------------------------------------------------------------------------- trust figures


def edge(seconds: float) -> str:
    """A recovery-time bucket's edge as words: ``0.1 s``, ``2.5 s``, ``2 min``, ``6 h``, ``3 d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


def recovery_time(r: Mapping[str, Any]) -> str:
    """One state's times over a window: ``p50 ≤ 1 s, p95 ≤ 30 s (3 left)``; ``-`` if none
    left it. A quantile past the last bucket reads ``> 7 d``."""
    if not r.get("count"):
        return "-"

    def bound(v: float | None) -> str:
        return "> 7 d" if v is None else f"≤ {edge(v)}"

    return f"p50 {bound(r['p50_s'])}, p95 {bound(r['p95_s'])} ({r['count']} left)"


def covered(t: Mapping[str, Any], now_ms: int) -> str:
    """What span a window's figures cover, in words."""
    if t.get("since_ms") is None:
        return "no samples yet (a scheduler writes one a minute)"
    if t.get("complete"):
        # the baseline is the last sample read before the window's start (a minute
        # before it at most for an hour, an hour for longer windows): say which
        since = datetime.fromtimestamp(int(t["since_ms"]) / 1000, UTC).strftime("%H:%M")
        span = t.get("window") or edge(float(t["window_s"]))
        return f"over the last {span} (counted from {since} UTC)"
    return f"over the last {duration((now_ms - int(t['since_ms'])) / 1000)} (since sampling began)"
