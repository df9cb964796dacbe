"""The chart's time series (toolq.services.scheduler.series) and the overview's shaping
(toolq.edges.monitor.shape_overview, shape_workers): pure parts as tables, the
sampler on fakeredis. The real scheduler writes it in tests/integration/test_status.py.
"""

from __future__ import annotations

import json
from typing import Any

import fakeredis
import pytest

from toolq.adapters.liveness import WorkerNode
from toolq.core.keys import Keys
from toolq.edges.monitor import shape, shape_overview, shape_workers
from toolq.edges.monitor.shape import per_minute
from toolq.services.scheduler import series
from toolq.services.scheduler.series import Point, Sampler

NOW = 1_800_000_000_000  # a whole minute
KEYS = Keys()


def sample(at: int, submitted: int = 0, succeeded: int = 0, **pending: int) -> dict[str, Any]:
    totals = {"submitted": submitted, "succeeded": succeeded, "failed": 0, "escalated": 0}
    return {"at": at, "totals": totals, "pending": pending}


def test_a_sample_sums_counters_over_tools() -> None:
    stats = {"a|submitted": 3, "b|submitted": 4, "a|succeeded": 2, "a|attempts": 9}

    s = series.sample_of(stats, {"waiting_retry": 5, "queued": 7}, NOW)

    assert s["totals"] == {"submitted": 7, "succeeded": 2, "failed": 0, "escalated": 0}
    assert s["pending"] == {
        "waiting_retry": 5,
        "verifying": 0,
        "needs_input": 0,
        "awaiting_approval": 0,
        "escalated": 0,
    }


@pytest.mark.parametrize(
    ("samples", "counts", "intervals"),
    [
        ([], [], []),
        ([sample(0, 5)], [{}], [0]),
        # consecutive: the difference; a gap: counted over the gap
        (
            [sample(0, 5), sample(60_000, 8), None, sample(180_000, 20)],
            [{}, {"submitted": 3}, {"submitted": 12}],
            [0, 60_000, 120_000],
        ),
        # the stats hash was reset: counted from 0 again, never negative
        ([sample(0, 50), sample(60_000, 4)], [{}, {"submitted": 4}], [0, 60_000]),
    ],
)
def test_points_count_since_the_sample_before(
    samples: list[dict[str, Any] | None], counts: list[dict[str, int]], intervals: list[int]
) -> None:
    points = series.points(samples)

    assert [{k: v for k, v in p.counts.items() if v} for p in points] == counts
    assert [p.interval_ms for p in points] == intervals


def test_the_fields_of_the_last_hours_and_the_one_before() -> None:
    fields = series.series_fields(NOW + 30_000, 0.05)  # 3 minutes

    assert fields == [NOW - 240_000, NOW - 180_000, NOW - 120_000, NOW - 60_000, NOW]


@pytest.mark.parametrize("raw", [None, b"nope", b"[]", b'{"totals": {}}', b'{"pending": {}}'])
def test_an_unreadable_sample_is_no_sample(raw: bytes | None) -> None:
    assert series.parse_sample(raw) is None


def test_the_sampler_writes_once_per_interval_and_forgets_old_ones() -> None:
    r = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    r.sadd(KEYS.tools, "pay", "look")
    r.zadd(KEYS.index("pay", "waiting_retry"), {"a": 1, "b": 2})
    r.zadd(KEYS.index("look", "waiting_retry"), {"c": 1})
    r.zadd(KEYS.index("pay", "queued"), {"d": 1})  # not gauged
    r.hset(KEYS.stats, mapping={"pay|submitted": 4, "look|submitted": 1})
    old = NOW - series.KEEP_S * 1000 - 60_000
    r.hset(KEYS.series, mapping={str(old): "{}", "junk": "x"})
    clock = [NOW / 1000 + 1.5]
    s = Sampler(lambda: r, KEYS, lambda: clock[0])

    assert s.maybe() is True
    assert s.maybe() is False  # same interval
    written = json.loads(r.hget(KEYS.series, str(NOW)))  # type: ignore[arg-type]
    assert written["totals"]["submitted"] == 5 and written["pending"]["waiting_retry"] == 3
    # each tool's counters apart: the charts read none of them
    assert "tools" not in written
    mine = json.loads(r.hget(KEYS.series_tools, str(NOW)))  # type: ignore[arg-type]
    assert mine == {
        "at": NOW,
        "read": NOW + 1_500,
        "tools": {"pay": {"submitted": 4}, "look": {"submitted": 1}},
    }
    assert not r.hexists(KEYS.series, str(old)) and r.hexists(KEYS.series, "junk")
    # another scheduler's sample of the same interval is left as it is
    r.hset(KEYS.stats, "pay|submitted", 100)
    Sampler(lambda: r, KEYS, lambda: clock[0]).sample(NOW)
    assert json.loads(r.hget(KEYS.series, str(NOW)))["totals"]["submitted"] == 5  # type: ignore[arg-type]
    clock[0] += 60
    assert s.maybe() is True and r.hexists(KEYS.series, str(NOW + 60_000))
    # the per-tool minutes are kept two hours
    clock[0] += series.KEEP_TOOLS_S
    assert s.maybe() is True
    assert not r.hexists(KEYS.series_tools, str(NOW)) and r.hexists(KEYS.series, str(NOW))


# --------------------------------------------------------------------------- the overview


def _snap(**kw: Any) -> dict[str, Any]:
    counts = {s: 0 for s in ("queued", "running", "waiting_retry", "needs_input",
                             "awaiting_approval", "verifying", "succeeded", "failed",
                             "escalated", "cancelled")}  # fmt: skip
    counts.update(waiting_retry=2, escalated=3)
    base: dict[str, Any] = {
        "now_ms": NOW,
        "prefix": "toolq",
        "tools": {"pay": (counts, {"waiting_retry": ("r/1", NOW - 90_000)})},
        "stats": {},
        "queues": {"toolq.calls": 0},
        "unacked": 0,
        "due": (4, 1, NOW - 2_500),
        "schedulers": {},
    }
    base.update(kw)
    return shape(**base)


def test_the_overview_lists_pending_recovery_with_the_oldest_and_the_lag() -> None:
    recent = [
        Point(NOW - 120_000, {}, 0, {}),
        Point(NOW - 60_000, {"submitted": 30, "succeeded": 24}, 60_000, {}),
        Point(NOW, {"submitted": 90, "succeeded": 60}, 60_000, {}),
    ]

    ov = shape_overview(_snap(), {"pay": ("e/1", NOW - 3_600_000)}, recent, NOW)

    assert ov["pending"]["waiting_retry"] == {
        "count": 2,
        "oldest": {
            "tool": "pay",
            "ref": "r/1",
            "since": "2027-01-15T07:58:30.000+00:00",
            "age_s": 90.0,
        },
    }
    assert ov["pending"]["escalated"]["count"] == 3
    assert ov["pending"]["escalated"]["oldest"]["ref"] == "e/1"
    assert ov["pending"]["escalated"]["oldest"]["age_s"] == 3600.0
    assert ov["pending"]["verifying"] == {"count": 0, "oldest": None}
    assert ov["scheduler"]["lag_s"] == 2.5
    # 120 in the 2 minutes the stack has been up: count / window, not / 2 minutes
    assert ov["rates"]["last_5m"]["submitted"] == 24.0
    assert ov["rates"]["last_60m"]["succeeded"] == 1.4
    assert ov["tools"] == _snap()["tools"]  # the status snapshot is all there


@pytest.mark.parametrize(
    ("count", "minutes", "span_s", "rate"),
    [
        (1014, 5, 180, 202.8),  # the young stack: 3 minutes of history
        (1014, 60, 180, 16.9),  # not 338/min over "the last 60 minutes"
        (300, 5, 300, 60.0),  # history as long as the window
        (0, 5, 60, 0.0),
        (120, 5, 420, 17.14),  # a missed sample: the first point covers 7 minutes
        (1, 60, 60, 0.02),
    ],
)
def test_a_rate_is_the_count_over_the_window(
    count: int, minutes: int, span_s: int, rate: float
) -> None:
    assert per_minute(count, minutes, span_s * 1000) == rate


def test_no_samples_no_rates_and_nothing_due_no_lag() -> None:
    ov = shape_overview(_snap(due=(0, 0, None)), {}, [], NOW)

    assert ov["rates"]["last_5m"] == {
        "submitted": None,
        "succeeded": None,
        "failed": None,
        "escalated": None,
    }
    assert ov["scheduler"]["lag_s"] == 0.0
    assert ov["pending"]["escalated"]["oldest"] is None


def test_workers_from_their_beats() -> None:
    nodes = [
        WorkerNode("celery@a", 1, "prefork", 4, ("toolq.calls",), NOW - 10_000, NOW - 1_000),
        WorkerNode("celery@b", 2, "threads", 8, ("toolq.verify",), NOW - 99_000, NOW - 16_000),
    ]

    w = shape_workers(nodes, NOW)

    assert (w["checked"], w["source"], w["live"], w["names"]) == (
        True,
        "heartbeats",
        1,
        ["celery@a"],
    )
    assert [(n["node"], n["alive"], n["age_s"]) for n in w["nodes"]] == [("celery@a", True, 1.0)]
    assert [(n["node"], n["age_s"]) for n in w["gone"]] == [("celery@b", 16.0)]


@pytest.mark.parametrize(
    ("beats_ago_s", "alive_s", "live", "gone"),
    [
        # node -> seconds since its last beat; a restarted node's dead entry is dropped
        ({"a#1": 1, "b#2": 16}, 15, ["a"], ["b"]),
        ({"a#1": 1, "b#2": 16}, 20, ["a", "b"], []),
        ({"a#1": 40, "a#2": 1}, 15, ["a"], []),  # the killed a, restarted: only the live one
        ({"a#1": 40, "a#2": 30}, 15, [], ["a", "a"]),
        ({"a#1": 6, "a#2": 1}, 5, ["a"], []),  # a short staleness, chosen in settings
        ({"a#1": 5}, 5, ["a"], []),  # exactly the staleness: still live
    ],
)
def test_stale_workers_leave_the_live_list(
    beats_ago_s: dict[str, int], alive_s: int, live: list[str], gone: list[str]
) -> None:
    def node(key: str, ago: int) -> WorkerNode:
        name, pid = key.split("#")
        return WorkerNode(f"calls@{name}", int(pid), "solo", 1, ("q",), 0, NOW - ago * 1000)

    nodes = [node(k, ago) for k, ago in beats_ago_s.items()]
    w = shape_workers(nodes, NOW, alive_s * 1000)
    assert [n["node"] for n in w["nodes"]] == [f"calls@{x}" for x in live]
    assert [n["node"] for n in w["gone"]] == [f"calls@{x}" for x in gone]
    assert w["live"] == len(live)


def test_a_worker_entry_round_trips_and_a_bad_one_is_skipped() -> None:
    n = WorkerNode("celery@a", 1, "solo", 1, ("q",), 5, 6)
    assert WorkerNode.from_json(n.to_json()) == n
    assert WorkerNode.from_json(b'{"node": "x"}') is None
    assert WorkerNode.from_json(b"nope") is None


def test_the_sampler_keeps_the_first_sample_of_each_hour_for_eight_days() -> None:
    r = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    r.sadd(KEYS.tools, "pay")
    r.hset(KEYS.stats, mapping={"pay|submitted": 4, "pay|unknown": 1})
    hour = NOW // 3_600_000 * 3_600_000
    old = hour - series.KEEP_HOURLY_S * 1000 - 3_600_000
    r.hset(KEYS.series_hourly, mapping={str(old): "{}", str(hour - 3_600_000): "{}"})
    clock = [hour / 1000 + 120.5]  # two minutes into the hour
    s = Sampler(lambda: r, KEYS, lambda: clock[0])

    assert s.maybe() is True
    first = json.loads(r.hget(KEYS.series_hourly, str(hour)))  # type: ignore[arg-type]
    assert first["at"] == hour + 120_000 and first["tools"] == {
        "pay": {"submitted": 4, "unknown": 1}
    }
    assert not r.hexists(KEYS.series_hourly, str(old))
    assert r.hexists(KEYS.series_hourly, str(hour - 3_600_000))
    # the next minutes of the hour leave it; another scheduler's too
    r.hset(KEYS.stats, "pay|unknown", 7)
    clock[0] += 60
    assert s.maybe() is True
    Sampler(lambda: r, KEYS, lambda: clock[0]).sample(hour + 180_000)
    assert json.loads(r.hget(KEYS.series_hourly, str(hour)))["at"] == hour + 120_000  # type: ignore[arg-type]
    # the next hour's first sample is kept
    clock[0] += 3600
    assert s.maybe() is True
    nxt = json.loads(r.hget(KEYS.series_hourly, str(hour + 3_600_000)))  # type: ignore[arg-type]
    assert nxt["tools"]["pay"]["unknown"] == 7
