"""The trust figures (toolq.services.scheduler.trust) from samples, as tables; the
recovery-time names (toolq.core.stats); the windows' fields (series.window_fields).
The ledger counting them is in tests/contract/test_scripts.py, a real stack's in
tests/integration/test_trust.py."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.core import stats
from toolq.edges.api.console import present
from toolq.services.scheduler import series
from toolq.services.scheduler.trust import quantile_le_s, trust_figures, window_samples

NOW = 1_800_000_000_000  # a whole hour
H = 3_600_000
M = 60_000


def s(at: int, **tools: dict[str, int]) -> dict[str, Any]:
    return {"at": at, "totals": {}, "pending": {}, "tools": tools}


def fig(samples: list[dict[str, Any]], window_s: int = 3600, tool: str = "pay") -> dict[str, Any]:
    out = trust_figures(samples, now_ms=NOW, window_s=window_s)
    figures: dict[str, Any] = out["tools"].get(tool, {})
    return {k: v for k, v in figures.items() if k != "recovery" and v}


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        # nothing sampled: nothing to measure against
        ([], {}),
        ([s(NOW, pay={"unknown": 5})], {}),
        # the growth since the sample at the window's start
        (
            [s(NOW - H, pay={"unknown": 2}), s(NOW, pay={"unknown": 7, "verify_found": 3})],
            {"unknown": 5, "found": 3},
        ),
        # the last sample at or before the start is the baseline; older ones do not count
        (
            [
                s(NOW - 3 * H, pay={"unknown": 1}),
                s(NOW - H - M, pay={"unknown": 4}),
                s(NOW - H + M, pay={"unknown": 6}),
                s(NOW, pay={"unknown": 9}),
            ],
            {"unknown": 5},
        ),
        # a counter that went down (the stats hash was reset) counts from 0 again
        (
            [s(NOW - H, pay={"escalated": 50}), s(NOW - M, pay={"escalated": 2}),
             s(NOW, pay={"escalated": 5})],
            {"escalated": 5},
        ),
        # a tool first seen in the window: all its counts are the window's
        ([s(NOW - H), s(NOW, pay={"duplicates_prevented": 1})],
         {"deliveries_refused": 1, "duplicates_prevented": 1}),
        # the figures that add counters up
        (
            [s(NOW - H), s(NOW, pay={"verify_escalated": 1, "no_verifier": 2,
                                     "duplicate_submits": 3, "duplicates_prevented": 1,
                                     "verify_not_found": 2, "resolved_retry": 1,
                                     "resolved_committed": 2, "resolved_not_committed": 4})],
            {"unknown_escalated": 3, "submits_deduplicated": 3, "deliveries_refused": 1,
             "duplicates_prevented": 4, "not_found": 2, "resolved_retry": 1,
             "resolved_committed": 2, "resolved_not_committed": 4},
        ),
        # a sample read after the counters now (labelled earlier: its interval's start)
        # is left out: against the reading now its counts would look like a reset
        ([s(NOW - H), {**s(NOW - M, pay={"unknown": 9}), "read": NOW + 5},
          s(NOW, pay={"unknown": 7})], {"unknown": 7}),
        # samples later than now are not read
        ([s(NOW - H), s(NOW, pay={"unknown": 1}), s(NOW + M, pay={"unknown": 9})], {"unknown": 1}),
    ],
)  # fmt: skip
def test_each_figure_is_the_growth_of_its_counters_over_the_window(
    samples: list[dict[str, Any]], expected: dict[str, int]
) -> None:
    assert fig(samples) == expected


def test_the_window_says_what_span_the_samples_cover() -> None:
    full = trust_figures([s(NOW - 2 * H), s(NOW)], now_ms=NOW, window_s=3600)
    young = trust_figures([s(NOW - 10 * M), s(NOW)], now_ms=NOW, window_s=3600)
    none = trust_figures([], now_ms=NOW, window_s=3600)

    assert (full["complete"], full["since_ms"], full["span_s"]) == (True, NOW - 2 * H, 7200.0)
    assert (young["complete"], young["since_ms"], young["span_s"]) == (False, NOW - 10 * M, 600.0)
    assert (none["complete"], none["since_ms"], none["span_s"], none["tools"]) == (
        False,
        None,
        0.0,
        {},
    )


def test_the_figures_of_all_tools_add_theirs_up() -> None:
    out = trust_figures(
        [
            s(NOW - H),
            s(NOW, pay={"unknown": 2, "recovery_ms:verifying:500": 1},
              mail={"unknown": 3, "recovery_ms:verifying:500": 2,
                    "recovery_ms:verifying:sum": 900}),
        ],
        now_ms=NOW,
        window_s=3600,
    )  # fmt: skip

    assert out["all"]["unknown"] == 5
    assert out["all"]["recovery"]["verifying"]["count"] == 3
    assert out["tools"]["mail"]["recovery"]["verifying"]["mean_s"] == 0.45


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        ({}, 0.5, None),
        ({"100": 3, "1000": 1}, 0.5, 0.1),
        ({"100": 3, "1000": 1}, 0.95, 1.0),
        ({"100": 1, "1000": 1}, 0.5, 0.1),  # the rank falls on the first bucket's last
        ({"5000": 19, "60000": 1}, 0.95, 5.0),
        ({"5000": 18, "60000": 2}, 0.95, 60.0),
        ({"inf": 2}, 0.5, None),  # past the last edge: a count, no bound
        ({"604800000": 1, "inf": 1}, 0.5, 604.8 * 1000),
        ({"100": 1, "sum": 99}, 0.5, 0.1),  # the sum is not a bucket
    ],
)
def test_a_quantile_is_the_upper_edge_of_its_bucket(
    buckets: dict[str, int], q: float, expected: float | None
) -> None:
    assert quantile_le_s(buckets, q) == expected


def test_recovery_times_per_state_over_the_window() -> None:
    before = {"recovery_ms:waiting_retry:1000": 4, "recovery_ms:waiting_retry:sum": 2000}
    after = {
        "recovery_ms:waiting_retry:1000": 6,
        "recovery_ms:waiting_retry:30000": 1,
        "recovery_ms:waiting_retry:sum": 2000 + 1400 + 20000,
        "recovery_ms:awaiting_approval:inf": 1,
        "recovery_ms:awaiting_approval:sum": 700_000_000,
    }

    rec = trust_figures([s(NOW - H, pay=before), s(NOW, pay=after)], now_ms=NOW, window_s=3600)[
        "tools"
    ]["pay"]["recovery"]

    assert rec["waiting_retry"] == {"count": 3, "p50_s": 1.0, "p95_s": 30.0, "mean_s": 7.133}
    assert rec["awaiting_approval"] == {
        "count": 1,
        "p50_s": None,
        "p95_s": None,
        "mean_s": 700_000.0,
    }
    assert rec["verifying"]["count"] == rec["needs_input"]["count"] == 0


def test_two_tiers_mixed_one_sample_per_time() -> None:
    minute = s(NOW - 7 * 24 * H, pay={"unknown": 1})
    hourly_copy = dict(minute)
    used = window_samples([s(NOW), hourly_copy, minute, s(NOW - H)], NOW, 7 * 24 * 3600)

    assert [u["at"] for u in used] == [NOW - 7 * 24 * H, NOW - H, NOW]


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("recovery_ms:verifying:5000", ("verifying", "5000")),
        ("recovery_ms:needs_input:inf", ("needs_input", "inf")),
        ("recovery_ms:waiting_retry:sum", ("waiting_retry", "sum")),
        ("recovery_ms:running:5000", None),  # not a pending-recovery state
        ("recovery_ms:verifying:x", None),
        ("unknown", None),
    ],
)
def test_recovery_field_names(name: str, parsed: tuple[str, str] | None) -> None:
    assert stats.parse_recovery_field(name) == parsed


def test_prometheus_buckets_are_cumulative_in_seconds() -> None:
    out = stats.cumulative({"100": 2, "1000": 1, "inf": 1, "sum": 5})

    assert out[0] == ("0.1", 2) and out[2] == ("1", 3) and out[-1] == ("+Inf", 4)
    assert len(out) == len(stats.RECOVERY_BUCKETS_MS) + 1


def test_a_sample_keeps_each_tools_trust_counters_not_zero() -> None:
    raw = {
        "pay|unknown": 2,
        "pay|attempts": 9,  # not a trust counter: summed nowhere, not kept
        "pay|recovery_ms:verifying:500": 1,
        "pay|resolved_retry": 0,
        "mail|submitted": 3,
    }

    assert series.sample_of(raw, {}, NOW)["tools"] == {
        "pay": {"unknown": 2, "recovery_ms:verifying:500": 1},
        "mail": {"submitted": 3},
    }


def test_the_fields_a_window_reads() -> None:
    # an hour: the minutes up to its start, then one every 10 minutes, per-tool tier
    minutes, hours = series.window_fields(NOW + 30_000, 3600)
    assert minutes == [NOW - H - k * M for k in range(5, -1, -1)] + [
        NOW - H + k * 10 * M for k in range(1, 7)
    ]
    assert hours == []
    # longer: the hour of its start and the one before, then every hour of a day
    minutes, hours = series.window_fields(NOW + 30_000, 24 * 3600)
    assert minutes == []
    assert hours == [NOW - 25 * H + k * H for k in range(26)]
    # ... or every 7th hour of a week
    minutes, hours = series.window_fields(NOW + 30_000, 7 * 24 * 3600)
    assert hours == [NOW - 169 * H, NOW - 168 * H] + [
        NOW - 168 * H + k * 7 * H for k in range(1, 25)
    ]


@pytest.mark.parametrize(
    ("figures", "text"),
    [
        ({"count": 0, "p50_s": None, "p95_s": None}, "-"),
        ({"count": 3, "p50_s": 0.1, "p95_s": 2.5}, "p50 ≤ 0.1 s, p95 ≤ 2.5 s (3 left)"),
        ({"count": 2, "p50_s": 120.0, "p95_s": 21600.0}, "p50 ≤ 2 min, p95 ≤ 6 h (2 left)"),
        ({"count": 1, "p50_s": 604800.0, "p95_s": None}, "p50 ≤ 7 d, p95 > 7 d (1 left)"),
    ],
)
def test_the_console_writes_a_states_times_as_bounds(figures: dict[str, Any], text: str) -> None:
    assert present.recovery_time(figures) == text


@pytest.mark.parametrize(
    ("window", "text"),
    [
        ({"since_ms": None, "window_s": 3600}, "no samples yet (a scheduler writes one a minute)"),
        (
            {"since_ms": NOW - 25 * H, "window_s": 86400, "complete": True, "window": "24h"},
            "over the last 24h (counted from 07:00 UTC)",
        ),
        (
            {"since_ms": NOW - 8 * M, "window_s": 3600, "complete": False},
            "over the last 8 min 0 s (since sampling began)",
        ),
    ],
)
def test_the_console_says_what_span_a_window_covers(window: dict[str, Any], text: str) -> None:
    assert present.covered(window, NOW) == text


@pytest.mark.parametrize(
    ("existing", "window_s", "expected"),
    [
        # a system older than the window: the baseline is among the minutes read
        ([NOW - H - 3 * M, NOW - H, NOW - M, NOW], 3600, None),
        # a young one: its first sample is on no field read, so it is read too
        ([NOW - 7 * M, NOW - 6 * M, NOW], 3600, NOW - 7 * M),
        # ... unless it is one of them
        ([NOW - 10 * M, NOW - 9 * M, NOW], 3600, None),
        # a gap in sampling longer than the minutes around the start: the last before it
        ([NOW - H - 30 * M, NOW - 20 * M, NOW], 3600, NOW - H - 30 * M),
        # nothing sampled yet; names that are not fields are skipped
        ([], 3600, None),
        (["first", str(NOW - 3 * M)], 3600, NOW - 3 * M),
        # the hourly tier of a week: a 10-hour-old system's first hour is read too
        ([NOW - 10 * H, NOW - 9 * H, NOW], 7 * 24 * 3600, NOW - 10 * H),
    ],
)
def test_the_baseline_a_windows_fields_missed_is_read(
    existing: list[Any], window_s: int, expected: int | None
) -> None:
    minutes, hours = series.window_fields(NOW + 30_000, window_s)
    fields = minutes or hours
    assert series.baseline_field(existing, fields, NOW + 30_000, window_s) == expected
