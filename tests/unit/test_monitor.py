"""The status snapshot: its reads (fakeredis), its shaping, its table and its metrics."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import fakeredis
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from toolq.adapters.ledger import Ledger
from toolq.adapters.observe import DISPATCH_LAG_SECONDS, PENDING_RECOVERY_SECONDS, observe_recovery
from toolq.client.queue import ToolQueue
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition
from toolq.edges.cli.monitor import render_status
from toolq.edges.metrics import LedgerCollector, observe_tick, snapshot_metrics
from toolq.edges.monitor import (
    COUNTERS,
    PENDING,
    SCHEDULER_ALIVE_MS,
    STATES,
    Sources,
    ping_workers,
    read_status,
    shape,
    waiting,
)
from toolq.services.scheduler.service import TickStats

NOW = 1_700_000_000_000
CALLS, VERIFY = "toolq.calls", "toolq.verify"


class CountingClient:
    """Only pipelines, and every command and round trip they send, are allowed."""

    def __init__(self, inner: redis.Redis) -> None:
        self.inner = inner
        self.round_trips = 0
        self.commands: list[str] = []

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self.inner.pipeline(transaction=transaction)
        execute = pipe.execute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.round_trips += 1
            self.commands += [str(c[0][0]).upper() for c in pipe.command_stack]
            return execute(*args, **kwargs)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe


def _submit(ledger: Ledger, ref: str, tool: str, at: int, state: State = State.QUEUED) -> None:
    res = ledger.submit(
        ref=ref, tool=tool, args_json="{}", fp=ref, call_id="", now_ms=at, max_attempts=5,
        deadline_ms=at + 3_600_000, state=state, due_ms=at + 60_000, queue=CALLS,
        message="m" if state is State.QUEUED else "",
    )  # fmt: skip
    assert res.outcome == "created"


def _move(ledger: Ledger, ref: str, to: State, at: int) -> None:
    """queued -> running (a claim) -> ``to``, entering ``to`` at ``at``."""
    assert ledger.claim(ref, 1, "w1", at, 15_000).outcome == "claimed"
    if to is not State.RUNNING:
        t = Transition(ref=ref, states=(State.RUNNING,), to=to, by="test", due_ms=at + 5_000)
        assert ledger.apply_one(t, at) == "ok"


@pytest.fixture
def ledger(fake_redis: fakeredis.FakeRedis) -> Ledger:
    return Ledger(fake_redis)


def _read(ledger: Ledger, **kw: Any) -> dict[str, Any]:
    return read_status(ledger.redis, Sources(ledger.keys, (CALLS, VERIFY)), now_ms=NOW, **kw)


# --------------------------------------------------------------------------- reads


def test_counts_states_and_ages_the_oldest_of_each_unfinished_state(ledger: Ledger) -> None:
    # Given invoices in several states, entered at known times
    for i in range(4):
        _submit(ledger, f"inv/{i}", "create_invoice", NOW - 90_000 + i * 1000)
    _move(ledger, "inv/0", State.WAITING_RETRY, NOW - 65_000)
    _move(ledger, "inv/1", State.WAITING_RETRY, NOW - 5_000)
    _move(ledger, "inv/2", State.VERIFYING, NOW - 12_000)
    _submit(ledger, "mail/0", "send_email", NOW - 30_000, State.AWAITING_APPROVAL)

    snap = _read(ledger)

    inv = snap["tools"]["create_invoice"]
    assert inv["states"] == {
        **dict.fromkeys(STATES, 0),
        "queued": 1,
        "waiting_retry": 2,
        "verifying": 1,
    }
    assert inv["pending_recovery"] == 3
    assert inv["oldest"]["waiting_retry"] == {
        "ref": "inv/0",
        "since": "2023-11-14T22:12:15.000+00:00",
        "age_s": 65.0,
    }
    assert inv["oldest"]["verifying"]["age_s"] == 12.0
    assert inv["oldest"]["queued"] == {
        "ref": "inv/3",
        "since": "2023-11-14T22:11:53.000+00:00",
        "age_s": 87.0,
    }
    assert "succeeded" not in inv["oldest"]
    assert snap["tools"]["send_email"]["oldest"]["awaiting_approval"]["age_s"] == 30.0
    assert snap["totals"]["pending_recovery"] == 4
    assert snap["totals"]["states"]["waiting_retry"] == 2
    assert snap["totals"]["oldest"]["awaiting_approval"]["tool"] == "send_email"
    assert inv["counters"]["submitted"] == 4
    assert inv["counters"]["attempts"] == 4
    assert set(COUNTERS) <= set(inv["counters"])


def test_one_round_trip_when_the_tools_are_known_and_never_a_scan(ledger: Ledger) -> None:
    _submit(ledger, "a", "create_invoice", NOW - 1000)
    _submit(ledger, "b", "send_email", NOW - 1000)
    client = CountingClient(ledger.redis)
    sources = Sources(ledger.keys, (CALLS, VERIFY))

    snap = read_status(
        cast(redis.Redis, client),
        sources,
        now_ms=NOW,
        tools_hint=["create_invoice", "send_email"],
    )

    assert client.round_trips == 1
    assert set(snap["tools"]) == {"create_invoice", "send_email"}
    assert not {"KEYS", "SCAN", "ZRANGEBYSCORE", "HSCAN", "SSCAN"} & set(client.commands)


def test_tools_the_hint_missed_cost_one_more_round_trip(ledger: Ledger) -> None:
    _submit(ledger, "a", "create_invoice", NOW - 1000)
    client = CountingClient(ledger.redis)

    snap = read_status(
        cast(redis.Redis, client),
        Sources(ledger.keys),
        now_ms=NOW,
        tools_hint=["not_in_the_ledger"],
    )

    assert client.round_trips == 2
    assert list(snap["tools"]) == ["create_invoice"]  # hinted tools with no data are left out
    assert snap["tools"]["create_invoice"]["states"]["queued"] == 1


def test_queue_depths_count_every_priority_list_and_the_unacked_hash(ledger: Ledger) -> None:
    r = ledger.redis
    r.lpush(CALLS, "m1", "m2")
    r.lpush(f"{CALLS}\x06\x163", "m3")
    r.lpush(f"{VERIFY}\x06\x169", "v1")
    r.hset("unacked", mapping={"tag1": "x", "tag2": "y"})

    snap = _read(ledger)

    never = {"last_beat_ms": None, "age_s": None, "alive": False}  # no worker beat yet
    assert snap["queues"] == {
        "depth": {CALLS: 3, VERIFY: 1},
        "unacked": 2,
        "workers": {CALLS: never, VERIFY: never},
    }


def test_scheduler_backlog_due_now_and_heartbeats(ledger: Ledger) -> None:
    r, keys = ledger.redis, ledger.keys
    r.zadd(keys.due, {"a": NOW - 2000, "b": NOW, "c": NOW + 30_000})
    r.hset(keys.schedulers, mapping={"s-live": NOW - 1000, "s-dead": NOW - 60_000})

    sched = _read(ledger)["scheduler"]

    assert (sched["backlog"], sched["due_now"]) == (3, 2)
    assert sched["next_due_ms"] == NOW - 2000
    assert sched["next_due_in_s"] == -2.0
    assert sched["live"] == 1
    alive = [(i["id"], i["alive"]) for i in sched["instances"]]
    assert alive == [("s-dead", False), ("s-live", True)]


def test_an_empty_ledger_reads_as_zeros(ledger: Ledger) -> None:
    snap = _read(ledger)

    assert snap["tools"] == {}
    assert snap["totals"]["pending_recovery"] == 0
    assert snap["scheduler"]["next_due_ms"] is None
    assert snap["workers"] == {"checked": False}


def test_the_worker_probe_runs_and_its_answer_is_included(ledger: Ledger) -> None:
    answer = {"checked": True, "live": 2, "names": ["celery@a", "celery@b"]}

    assert _read(ledger, workers=lambda: answer)["workers"] == answer


def _celery(inspect: Any) -> Any:
    return SimpleNamespace(celery=SimpleNamespace(control=SimpleNamespace(inspect=inspect)))


def test_ping_replies_become_sorted_names_and_a_failing_ping_is_reported() -> None:
    replies = SimpleNamespace(ping=lambda: {"celery@b": {"ok": "pong"}, "celery@a": {}})

    def broken(timeout: float) -> Any:
        raise ConnectionError("broker gone")

    ok = ping_workers(_celery(lambda timeout: replies), 0.1)
    assert ok == {"checked": True, "live": 2, "names": ["celery@a", "celery@b"]}
    failed = ping_workers(_celery(broken), 0.1)
    assert failed == {"checked": True, "live": None, "names": [], "error": "ConnectionError"}


# --------------------------------------------------------------------------- shaping


def _shape(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        now_ms=NOW,
        prefix="toolq",
        tools={},
        stats={},
        queues={},
        unacked=0,
        due=(0, 0, None),
        schedulers={},
    )
    return shape(**{**base, **kw})


@pytest.mark.parametrize(
    ("beat_age_ms", "alive"),
    [(0, True), (SCHEDULER_ALIVE_MS, True), (SCHEDULER_ALIVE_MS + 1, False)],
)
def test_a_scheduler_is_live_within_15_seconds_of_its_beat(beat_age_ms: int, alive: bool) -> None:
    snap = _shape(schedulers={"s": NOW - beat_age_ms})

    assert snap["scheduler"]["live"] == int(alive)


def test_counters_are_split_by_tool_and_unknown_names_are_kept() -> None:
    counts = dict.fromkeys(STATES, 0)
    stats = {"a|verify_found": 3, "a|brand_new": 1, "b|escalated": 2}

    snap = _shape(tools={"a": (counts, {}), "b": (counts, {})}, stats=stats)

    a, b = snap["tools"]["a"]["counters"], snap["tools"]["b"]["counters"]
    assert (a["verify_found"], a["brand_new"], a["escalated"]) == (3, 1, 0)
    assert (b["escalated"], b["verify_found"]) == (2, 0)


def test_totals_keep_the_oldest_across_tools() -> None:
    counts = {**dict.fromkeys(STATES, 0), "verifying": 1}
    tools = {
        "a": (counts, {"verifying": ("a/1", NOW - 5000)}),
        "b": (counts, {"verifying": ("b/1", NOW - 9000)}),
    }

    snap = _shape(tools=tools)

    assert snap["totals"]["oldest"]["verifying"]["ref"] == "b/1"
    assert snap["totals"]["states"]["verifying"] == 2


# --------------------------------------------------------------------------- the table


def test_the_table_shows_counts_ages_and_the_recovery_counters() -> None:
    counts = {**dict.fromkeys(STATES, 0), "waiting_retry": 2, "succeeded": 7}
    snap = _shape(
        tools={"create_invoice": (counts, {"waiting_retry": ("x", NOW - 65_000)})},
        stats={
            "create_invoice|verify_found": 4,
            "create_invoice|verify_not_found": 1,
            "create_invoice|duplicates_prevented": 3,
        },
        queues={CALLS: 5, VERIFY: 0},
        due=(9, 1, NOW - 100),
    )
    snap["workers"] = {"checked": True, "live": 1, "names": ["celery@w1"]}

    text = render_status(snap, source="redis://127.0.0.1:6379/0")

    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("TOOL") and "RETRY" in line)
    row = lines[lines.index(header) + 1]
    assert row.split()[:4] == ["create_invoice", "0", "0", "2"]
    assert "2 (1m05s)" in row
    assert "4/1/0" in text
    assert "toolq.calls 5" in text
    assert "due now 1" in text and "next now" in text
    assert "none live" in text  # a backlog and no scheduler
    assert "live 1  (celery@w1)" in text


def test_processes_waiting_for_a_dependency_show_what_and_since_when() -> None:
    snap = _shape(queues={CALLS: 0, VERIFY: 0})
    snap["outbox"] = {"waiting": [{"id": "r1", "for": "broker", "since": NOW - 40_000}]}
    node = {"node": "celery@w1", "alive": True, "waiting": {"for": "broker", "since": NOW - 5_000}}
    dead = {
        "node": "celery@w2",
        "alive": False,
        "age_s": 99,
        "waiting": {"for": "broker", "since": 1},
    }
    snap["workers"] = {"checked": True, "live": 1, "names": ["celery@w1"], "nodes": [node, dead]}

    snap["waiting"] = waiting(snap, NOW)

    assert snap["waiting"] == [
        {"who": "relay r1", "for": "broker", "since_ms": NOW - 40_000, "age_s": 40.0},
        {"who": "worker celery@w1", "for": "broker", "since_ms": NOW - 5_000, "age_s": 5.0},
    ]
    text = render_status({**snap, "outbox": None})
    # NOW is 2023-11-14 22:13:20 UTC
    assert "relay r1: waiting for the broker since 22:12:40 UTC (40s)" in text
    assert "worker celery@w1: waiting for the broker since 22:13:15 UTC (5s)" in text
    assert "celery@w2" not in text


def test_the_table_of_an_empty_ledger() -> None:
    text = render_status(_shape())

    assert "no operations in the ledger" in text
    assert "not checked" in text


# --------------------------------------------------------------------------- metrics


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_snapshot_metrics_name_every_series(ledger: Ledger) -> None:
    _submit(ledger, "a", "create_invoice", NOW - 4000)
    _move(ledger, "a", State.VERIFYING, NOW - 3000)

    registry = CollectorRegistry()

    class One:
        def collect(self) -> Any:
            return snapshot_metrics(_read(ledger))

    registry.register(One())
    fams = _families(generate_latest(registry).decode())

    assert {
        "toolq_operations", "toolq_pending_recovery_oldest_seconds", "toolq_attempts",
        "toolq_verification_verdicts", "toolq_duplicates_prevented", "toolq_escalations",
        "toolq_queue_messages", "toolq_scheduler_backlog",
    } <= set(fams)  # fmt: skip
    verifying = [s for s in fams["toolq_operations"].samples if s.labels["state"] == "verifying"]
    assert [s.value for s in verifying] == [1]
    oldest = {
        s.labels["state"]: s.value for s in fams["toolq_pending_recovery_oldest_seconds"].samples
    }
    assert oldest == {**dict.fromkeys(PENDING, 0.0), "verifying": 3.0}
    verdicts = {
        s.labels["verdict"]
        for s in fams["toolq_verification_verdicts"].samples
        if s.name.endswith("_total")
    }
    assert verdicts == {"found", "not_found", "recheck", "lookup_failed", "escalated"}


def test_an_unreachable_ledger_scrapes_as_down() -> None:
    down = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    tq = ToolQueue(redis_url="redis://127.0.0.1:1/0", clock=lambda: NOW / 1000)
    tq.app._redis = down
    registry = CollectorRegistry()
    registry.register(LedgerCollector(tq))

    fams = _families(generate_latest(registry).decode())

    assert [s.value for s in fams["toolq_ledger_up"].samples] == [0]
    assert "toolq_operations" not in fams


def test_observe_tick_feeds_the_dispatch_lag_histogram() -> None:
    before = _count(DISPATCH_LAG_SECONDS)

    observe_tick(TickStats(taken=2, applied=2, actions={"dispatch": 2}, lags_ms=[12, 40]))

    assert _count(DISPATCH_LAG_SECONDS) == before + 2


def test_operations_leaving_pending_recovery_are_observed() -> None:
    stats = TickStats()
    setattr(stats, "recovered", [("tick_tool", "waiting_retry", 1500)])  # noqa: B010

    observe_tick(stats)
    observe_recovery("tick_tool", -1, state="verifying")  # clock skew: never negative

    samples = [s for m in PENDING_RECOVERY_SECONDS.collect() for s in m.samples]
    sums = {s.labels["state"]: s.value for s in samples
            if s.name.endswith("_sum") and s.labels["tool"] == "tick_tool"}  # fmt: skip
    assert sums == {"waiting_retry": 1.5, "verifying": 0.0}


def _count(hist: Any) -> float:
    return float(
        next(s.value for m in hist.collect() for s in m.samples if s.name.endswith("_count"))
    )
