"""A small time series of the ledger, kept in Redis by the scheduler, for charts.

Every :data:`EVERY_S` a scheduler writes one sample into a hash
(:attr:`toolq.core.keys.Keys.series`), field = the interval's start (ms): the
ledger's cumulative counters summed over tools (:data:`COUNTED`) and the
number of operations in each pending-recovery state. ``HSETNX``: when several
schedulers run, the first to sample an interval writes it and the others
leave it. Samples older than :data:`KEEP_S` are deleted as new ones are
written, so the hash holds at most a day of minutes (1,440 short fields).

Each tool's own cumulative counters (``tools``: the trust counters of
:data:`toolq.core.stats.TRUST_COUNTERS`, :data:`COUNTED`, and the recovery-time
buckets; only those not 0), which the trust figures
(:mod:`toolq.services.scheduler.trust`) are computed from, go to hashes of their own,
with the same ``HSETNX``: every minute's for :data:`KEEP_TOOLS_S` (2 hours:
:attr:`toolq.core.keys.Keys.series_tools`, the 1-hour window's), and the first of
every hour for :data:`KEEP_HOURLY_S` (8 days, 192 fields:
:attr:`toolq.core.keys.Keys.series_hourly`, the 24-hour and 7-day windows'). A
tool's part grows with its buckets (~1.7 KB for a tool using every counter and 8
buckets of each state): kept apart, it costs the charts' reads nothing, and a day
of it is never kept a minute at a time.

Any process draws the chart from it (:func:`read_series`): one ``HMGET`` of
the fields an interval apart, and per point the counts since the sample
before (cumulative counters make a sample missed while no scheduler ran cost
resolution, never a wrong total).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from toolq.core.keys import Keys
from toolq.core.states import State
from toolq.core.stats import TRUST_COUNTERS, is_recovery_field
from toolq.core.text import as_text

#: Seconds between samples.
EVERY_S = 60
#: Seconds of samples kept.
KEEP_S = 24 * 3600
#: Seconds the per-tool minute samples are kept.
KEEP_TOOLS_S = 2 * 3600
#: Seconds between samples of the coarse tier, and how long it keeps them.
HOURLY_S = 3600
KEEP_HOURLY_S = 8 * 24 * 3600
#: The fields of the charts' part of a sample; the rest is the per-tool part.
CHART_FIELDS = ("at", "totals", "pending")
#: The ledger's counters (``<tool>|<name>`` in the stats hash) a sample sums.
COUNTED: tuple[str, ...] = ("submitted", "succeeded", "failed", "escalated")
#: The counters a sample keeps per tool (and every recovery-time bucket).
PER_TOOL: tuple[str, ...] = tuple(dict.fromkeys((*COUNTED, *TRUST_COUNTERS)))
#: States whose size a sample records: what waits on recovery, and what a person must see.
GAUGED: tuple[str, ...] = (
    State.WAITING_RETRY.value,
    State.VERIFYING.value,
    State.NEEDS_INPUT.value,
    State.AWAITING_APPROVAL.value,
    State.ESCALATED.value,
)


@dataclass(frozen=True)
class Point:
    """One interval of the chart."""

    #: The interval's start (ms).
    at_ms: int
    #: Counts in the interval since the sample before (``interval_ms`` earlier):
    #: submitted, succeeded, failed, escalated. Empty for the first point.
    counts: dict[str, int]
    interval_ms: int
    #: Operations in each state of :data:`GAUGED` at the sample.
    pending: dict[str, int]

    @property
    def pending_recovery(self) -> int:
        """Operations waiting on recovery (escalated ones are finished: not counted)."""
        return sum(n for s, n in self.pending.items() if s != State.ESCALATED.value)


def bucket(now_ms: int, every_s: int = EVERY_S) -> int:
    every = every_s * 1000
    return now_ms // every * every


def sample_of(
    stats: dict[str, int], sizes: dict[str, int], at_ms: int, read_ms: int | None = None
) -> dict[str, Any]:
    """The sample written for ``at_ms``: counters summed over tools, each tool's own
    (:data:`PER_TOOL` and the recovery-time buckets, those not 0), state sizes, and
    when the counters were read (``read``: a sample is labelled with its interval's
    start but read a little later; the trust figures order samples by it). Pure."""
    totals = dict.fromkeys(COUNTED, 0)
    tools: dict[str, dict[str, int]] = {}
    for key, n in stats.items():
        tool, _, name = key.partition("|")
        if name in totals:
            totals[name] += int(n)
        if int(n) and (name in PER_TOOL or is_recovery_field(name)):
            tools.setdefault(tool, {})[name] = int(n)
    return {
        "at": at_ms,
        "totals": totals,
        "pending": {s: sizes.get(s, 0) for s in GAUGED},
        "tools": tools,
        "read": at_ms if read_ms is None else read_ms,
    }


def points(samples: Sequence[dict[str, Any] | None]) -> list[Point]:
    """Chart points from samples in time order (None: not sampled). Pure.

    A counter that went down (the stats hash was reset) counts from 0 again.
    """
    out: list[Point] = []
    before: dict[str, Any] | None = None
    for s in samples:
        if s is None:
            continue
        counts: dict[str, int] = {}
        interval = 0
        if before is not None:
            interval = int(s["at"]) - int(before["at"])
            for name in COUNTED:
                now, then = int(s["totals"].get(name, 0)), int(before["totals"].get(name, 0))
                counts[name] = now - then if now >= then else now
        pending = {st: int(s["pending"].get(st, 0)) for st in GAUGED}
        out.append(Point(int(s["at"]), counts, interval, pending))
        before = s
    return out


def _json_object(raw: Any) -> dict[str, Any] | None:
    """A stored sample's JSON object, or None (missing, not JSON, not an object)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_sample(raw: Any) -> dict[str, Any] | None:
    data = _json_object(raw) or {}
    ok = isinstance(data.get("totals"), dict) and isinstance(data.get("pending"), dict)
    return data if ok else None


def parse_tools_sample(raw: Any) -> dict[str, Any] | None:
    """A per-tool sample (``at``, ``read``, ``tools``), or None if it is not one."""
    data = _json_object(raw) or {}
    ok = isinstance(data.get("at"), int) and isinstance(data.get("tools"), dict)
    return data if ok else None


def series_fields(now_ms: int, hours: float, every_s: int = EVERY_S) -> list[int]:
    """The sample fields of the last ``hours``, oldest first, plus the one before
    (the first point's counts are measured from it)."""
    every = every_s * 1000
    last = bucket(now_ms, every_s)
    n = int(hours * 3600 * 1000) // every
    return [last - k * every for k in range(n + 1, -1, -1)]


def window_fields(now_ms: int, window_s: int) -> tuple[list[int], list[int]]:
    """The per-tool fields a window's figures are read from: of the minute tier, for a
    window of an hour or less (the minutes up to its start, where the baseline is, then
    one every 10 minutes, where a reset would show); of the hourly tier for a longer one
    (the hour of its start and the one before, then one a day's 24th of the window: every
    hour of a day, every 7th of a week; 7 days of every hour cost 136 ms to read and
    parse for 5 busy tools, where the page refreshes every 3 s). The last point is read
    live, not sampled."""
    every = EVERY_S * 1000
    start = bucket(now_ms - window_s * 1000)
    if window_s <= HOURLY_S:
        minutes = [start - k * every for k in range(5, -1, -1)]
        minutes += list(range(start + 10 * every, bucket(now_ms) + 1, 10 * every))
        return minutes, []
    hour = HOURLY_S * 1000
    base = bucket(now_ms - window_s * 1000, HOURLY_S)
    step = hour * max(1, window_s // (24 * HOURLY_S))
    return [], [base - hour, base, *range(base + step, bucket(now_ms, HOURLY_S) + 1, step)]


def baseline_field(
    existing: Sequence[Any], read: Sequence[int], now_ms: int, window_s: int
) -> int | None:
    """The field a window's baseline is in when :func:`window_fields` did not read it, else
    None (pure). ``existing``: the tier's fields (``HKEYS``); ``read``: those read.

    The baseline is the last sample at or before the window's start; on a system younger
    than the window (or after a gap in sampling longer than the fields around the start)
    it is the first sample there is. The sparse fields after the start miss that one
    unless it falls on one of them: a window would then count from a later sample, and
    leave out what happened before it (a CI run's 1-hour figures counted 1 of 6 unknown
    outcomes: the stack was 1 minute old, its first sample on no 10-minute field)."""
    start = now_ms - window_s * 1000
    fields = sorted(int(f) for f in map(as_text, existing) if f.isdigit())
    before = [f for f in fields if f <= start]
    want = before[-1] if before else (fields[0] if fields else None)
    return None if want is None or want in read else want


@dataclass
class Sampler:
    """Writes a sample when an interval begins (the scheduler calls :meth:`maybe`)."""

    client: Callable[[], redis.Redis]
    keys: Keys
    clock: Callable[[], float]
    every_s: int = EVERY_S
    keep_s: int = KEEP_S
    #: Cells mode: the keys of every cell, whose counts a sample sums (none: ``keys``').
    cells: list[Keys] = field(default_factory=list)
    hourly_s: int = HOURLY_S
    keep_hourly_s: int = KEEP_HOURLY_S
    keep_tools_s: int = KEEP_TOOLS_S
    _last: int = field(default=-1, init=False)
    _last_hour: int = field(default=-1, init=False)

    def maybe(self) -> bool:
        """Sample if this interval has not been sampled by this process; True if it did."""
        at = bucket(int(self.clock() * 1000), self.every_s)
        if at == self._last:
            return False
        self.sample(at)
        self._last = at
        return True

    def sample(self, at_ms: int) -> None:
        """Write the sample for the interval starting ``at_ms`` (if no one has) and trim."""
        r = self.client()
        cells = self.cells or [self.keys]
        pipe = r.pipeline(transaction=False)
        for keys in cells:
            pipe.smembers(keys.tools)
            pipe.hgetall(keys.stats)
        pipe.hkeys(self.keys.series)
        pipe.hkeys(self.keys.series_tools)
        *read, fields, tool_fields = pipe.execute()
        tools = sorted({as_text(t) for members in read[0::2] for t in members})
        stats: dict[str, int] = {}
        for raw_stats in read[1::2]:  # summed over the cells
            for k, v in raw_stats.items():
                stats[as_text(k)] = stats.get(as_text(k), 0) + int(v)
        pipe = r.pipeline(transaction=False)
        for tool in tools:
            for keys in cells:
                for state in GAUGED:
                    pipe.zcard(keys.index(tool, state))
        cards = iter(pipe.execute())
        sizes = dict.fromkeys(GAUGED, 0)
        for _ in range(len(tools) * len(cells)):
            for state in GAUGED:
                sizes[state] += int(next(cards))
        whole = sample_of(stats, sizes, at_ms, int(self.clock() * 1000))
        chart = {k: whole[k] for k in CHART_FIELDS}
        mine = json.dumps({k: v for k, v in whole.items() if k not in CHART_FIELDS[1:]},
                          separators=(",", ":"))  # fmt: skip
        pipe = r.pipeline(transaction=False)
        pipe.hsetnx(self.keys.series, str(at_ms), json.dumps(chart, separators=(",", ":")))
        pipe.hsetnx(self.keys.series_tools, str(at_ms), mine)
        for key, names, keep_s in (
            (self.keys.series, fields, self.keep_s),
            (self.keys.series_tools, tool_fields, self.keep_tools_s),
        ):
            cutoff = at_ms - keep_s * 1000
            old = [f for f in map(as_text, names) if f.isdigit() and int(f) < cutoff]
            if old:
                pipe.hdel(key, *old)
        hour = bucket(at_ms, self.hourly_s)
        if hour != self._last_hour:
            # The coarse tier: the first sample of the hour (any scheduler's) stays.
            pipe.hsetnx(self.keys.series_hourly, str(hour), mine)
            pipe.hkeys(self.keys.series_hourly)
        replies = pipe.execute()
        if hour != self._last_hour:
            self._last_hour = hour
            gone = at_ms - self.keep_hourly_s * 1000
            stale = [f for f in map(as_text, replies[-1]) if f.isdigit() and int(f) < gone]
            if stale:
                r.hdel(self.keys.series_hourly, *stale)
