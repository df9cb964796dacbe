"""The trust figures per tool over a window, from the series' samples (pure).

What the seed asks toolq to measure besides its error rate: unknown outcomes and how
verification resolved them, duplicates the ledger prevented, the time operations
spent in each pending-recovery state, escalations and what operators did with them.
Every figure is the growth of a ledger counter (:mod:`toolq.core.stats`) between two
samples of :mod:`toolq.services.scheduler.series`: the one at (or just before) the
window's start, and the last (the console passes one read now). A counter that went
down (the stats hash was reset) counts from 0 again, pair of samples by pair.

Recovery times come from the ledger's fixed buckets: ``p50_s``/``p95_s`` are the
upper edge of the bucket the quantile falls in (an upper bound, as precise as the
buckets: :data:`toolq.core.stats.RECOVERY_BUCKETS_MS`), None when nothing left the
state in the window, or when the quantile is past the last edge (``count`` says which).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from toolq.core.stats import (
    INF,
    RECOVERY_BUCKETS_MS,
    RECOVERY_STATES,
    RESOLUTIONS,
    SUM,
    parse_recovery_field,
)

#: The windows the pages offer, by the name a URL uses: seconds.
WINDOWS: dict[str, int] = {"1h": 3600, "24h": 24 * 3600, "7d": 7 * 24 * 3600}

#: Each figure: the counters it adds up.
FIGURES: dict[str, tuple[str, ...]] = {
    "unknown": ("unknown",),
    "found": ("verify_found",),
    "not_found": ("verify_not_found",),
    "unknown_escalated": ("verify_escalated", "no_verifier"),
    "deliveries_refused": ("duplicates_prevented",),
    "submits_deduplicated": ("duplicate_submits",),
    "duplicates_prevented": ("duplicates_prevented", "duplicate_submits"),
    "escalated": ("escalated",),
    **{name: (name,) for name in RESOLUTIONS},
}


def growth(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per tool, how much each counter grew from the first sample to the last (samples
    in time order; a counter that went down counts from 0 again)."""
    out: dict[str, dict[str, int]] = {}
    for before, after in pairwise(samples):
        then_tools = before.get("tools") or {}
        for tool, now in (after.get("tools") or {}).items():
            then = then_tools.get(tool) or {}
            mine = out.setdefault(tool, {})
            for name, n in now.items():
                was = int(then.get(name, 0))
                d = int(n) - was if int(n) >= was else int(n)
                if d:
                    mine[name] = mine.get(name, 0) + d
    return out


def window_samples(
    samples: Iterable[Mapping[str, Any]], now_ms: int, window_s: int
) -> list[Mapping[str, Any]]:
    """The samples a window is measured on, in the order their counters were read: the
    last one read at or before its start (else the first there is: the window is only
    partly covered), and every later one read up to ``now_ms`` (a sample read after
    the console's own reading of the counters is left out: its counts would look like
    a reset). Samples of both tiers may be mixed; one per time."""
    by_read = {_read(s): s for s in samples if _read(s) <= now_ms}
    ordered = [by_read[t] for t in sorted(by_read)]
    start = now_ms - window_s * 1000
    first = 0
    for i, s in enumerate(ordered):
        if _read(s) <= start:
            first = i
    return ordered[first:]


def _read(sample: Mapping[str, Any]) -> int:
    return int(sample.get("read", sample["at"]))


def quantile_le_s(buckets: Mapping[str, int], q: float) -> float | None:
    """The upper edge (s) of the bucket holding quantile ``q`` of the times counted in
    ``buckets`` (``le`` -> n, not cumulative); None if none, or past the last edge."""
    total = sum(int(buckets.get(le, 0)) for le in (*map(str, RECOVERY_BUCKETS_MS), INF))
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for e in RECOVERY_BUCKETS_MS:
        seen += int(buckets.get(str(e), 0))
        if seen >= rank:
            return e / 1000
    return None


def recovery_times(counts: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Per pending-recovery state: how many left it, the p50/p95 bounds and the mean."""
    by_state: dict[str, dict[str, int]] = {s: {} for s in RECOVERY_STATES}
    for name, n in counts.items():
        parsed = parse_recovery_field(name)
        if parsed is not None:
            state, le = parsed
            by_state[state][le] = by_state[state].get(le, 0) + int(n)
    out: dict[str, dict[str, Any]] = {}
    for state, buckets in by_state.items():
        count = sum(n for le, n in buckets.items() if le != SUM)
        out[state] = {
            "count": count,
            "p50_s": quantile_le_s(buckets, 0.5),
            "p95_s": quantile_le_s(buckets, 0.95),
            "mean_s": round(buckets.get(SUM, 0) / count / 1000, 3) if count else None,
        }
    return out


def figures_of(counts: Mapping[str, int]) -> dict[str, Any]:
    """One tool's figures (or all tools') from how much its counters grew."""
    out: dict[str, Any] = {
        name: sum(int(counts.get(c, 0)) for c in names) for name, names in FIGURES.items()
    }
    out["recovery"] = recovery_times(counts)
    return out


def trust_figures(
    samples: Iterable[Mapping[str, Any]], *, now_ms: int, window_s: int
) -> dict[str, Any]:
    """The trust figures over the last ``window_s`` before ``now_ms``: per tool, for
    all tools, and which span the samples cover (``complete``: the whole window)."""
    used = window_samples(samples, now_ms, window_s)
    grown = growth(used)
    every: dict[str, int] = {}
    for counts in grown.values():
        for name, n in counts.items():
            every[name] = every.get(name, 0) + n
    tools = sorted({t for s in used for t in (s.get("tools") or {})})
    since = _read(used[0]) if used else None
    return {
        "window_s": window_s,
        "since_ms": since,
        "span_s": (_read(used[-1]) - since) / 1000 if used and since is not None else 0.0,
        "complete": since is not None and since <= now_ms - window_s * 1000,
        "tools": {t: figures_of(grown.get(t, {})) for t in tools},
        "all": figures_of(every),
    }
