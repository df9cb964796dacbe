"""The scheduler service against a real server (issue 4)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import (
    kill_group,
    start_scheduler,
    start_worker,
    stop_process,
    stop_processes,
    wait_until,
)
from tests.integration.conftest import APP, seen
from toolq import State, ToolQueue
from toolq.adapters.ledger import scripts
from toolq.decisions.recovery.transition import Transition
from toolq.services.scheduler.service import Scheduler


def _park(rt: ToolQueue, n: int, prefix: str, due_in_ms: int = 0) -> list[str]:
    """Submit n operations and move them to waiting_retry, all due in ``due_in_ms``."""
    refs = [f"{prefix}/{i}" for i in range(n)]
    now = int(time.time() * 1000)
    due = now + due_in_ms
    pipe = rt.redis.pipeline(transaction=False)
    # From a few threads: each submit waits for its fsync (appendfsync always), and the
    # server writes the waiting ones with one fsync (5,000 one at a time took ~20 s).
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in pool.map(lambda r: rt.submit("lookup", {"mode": r}, operation_ref=r), refs):
            pass
    for i in range(0, n, 500):
        batch = [
            Transition(ref=r, states=(State.QUEUED,), to=State.RUNNING, by="test")
            for r in refs[i : i + 500]
        ]
        rt.ledger.apply(batch, now)
        batch = [
            Transition(
                ref=r,
                states=(State.RUNNING,),
                to=State.WAITING_RETRY,
                by="test",
                due_ms=due,
                set={"retry_due": str(due)},
            )
            for r in refs[i : i + 500]
        ]
        rt.ledger.apply(batch, now)
    pipe.execute()
    rt.redis.delete(rt.settings.queues.calls)  # the submit messages: only dispatches count
    return refs


def _blocked_in_blpop(rt: ToolQueue) -> bool:
    """A client of this test's database is blocked in BLPOP: the scheduler sleeps."""
    db = rt.redis.connection_pool.connection_kwargs.get("db", 0)
    return any(
        c.get("cmd") == "blpop" and "b" in c.get("flags", "") and int(c.get("db", -1)) == db
        for c in rt.redis.client_list()
    )


def _dispatched(rt: ToolQueue) -> int:
    return int(rt.redis.llen(rt.settings.queues.calls))


def _dispatches_per_ref(rt: ToolQueue, refs: list[str]) -> set[int]:
    """How many waiting_retry -> queued transitions each ref's history holds."""
    counts = set()
    for ref in refs:
        entries = rt.ledger.history(ref)
        counts.add(
            sum(
                1
                for e in entries
                if (e.from_, e.to) == (State.WAITING_RETRY, State.QUEUED)
                or (b'"to":"queued"' in e and b'"from":"waiting_retry"' in e)
            )
        )
    return counts


@pytest.fixture(autouse=True)
def clean(rt: ToolQueue) -> Iterator[None]:
    rt.redis.flushdb()
    yield


def test_two_schedulers_racing_dispatch_each_item_once(
    rt: ToolQueue, module_redis_url: str
) -> None:
    refs = _park(rt, 1000, "race")
    a = start_scheduler(APP, module_redis_url)
    b = start_scheduler(APP, module_redis_url)
    try:
        assert wait_until(lambda: _dispatched(rt) >= 1000, 30)
    finally:
        # Stopped (and exited) before the counts are read: nothing can move after.
        stop_processes((a, b))
    attempts = {rt.ledger.fields(r, "attempt")["attempt"] for r in refs}
    assert attempts == {"2"}
    assert _dispatches_per_ref(rt, refs) == {1}
    # Every message is a dispatch, or a republish of one no worker took (none here)
    stats = rt.ledger.stats()
    assert stats["lookup|dispatched"] == 1000
    assert _dispatched(rt) == 1000 + stats.get("lookup|republished", 0)


def test_scheduler_killed_mid_batch_loses_and_doubles_nothing(
    rt: ToolQueue, module_redis_url: str
) -> None:
    refs = _park(rt, 5000, "kill")
    s = start_scheduler(APP, module_redis_url)
    assert wait_until(lambda: _dispatched(rt) > 0, 20, interval=0.005)
    kill_group(s)  # SIGKILL, mid-way through the backlog
    partial = _dispatched(rt)
    s = start_scheduler(APP, module_redis_url)
    try:
        # every item dispatched, past the hold of the batch the killed one took (the
        # ledger's count, one read; each ref's history is read once all are stopped)
        assert wait_until(lambda: rt.ledger.stats().get("lookup|dispatched", 0) >= 5000, 30)
    finally:
        # Stopped (and exited) before the counts are read: nothing can move after.
        stop_process(s, signal.SIGTERM)
    assert partial < 5000
    assert _dispatches_per_ref(rt, refs) == {1}
    attempts = {rt.ledger.fields(r, "attempt")["attempt"] for r in refs}
    assert attempts == {"2"}
    # each dispatch published its message once; unclaimed ones may be published again
    stats = rt.ledger.stats()
    assert stats["lookup|dispatched"] == 5000
    assert _dispatched(rt) == 5000 + stats.get("lookup|republished", 0)


def test_not_before_in_the_past_runs_at_once_and_absurd_one_escalates(
    rt: ToolQueue, module_redis_url: str
) -> None:
    procs = [start_worker(APP, module_redis_url), start_scheduler(APP, module_redis_url)]
    try:
        past = rt.submit("pay", {"mode": "past_not_before"}).operation_ref
        env = rt.wait(past, timeout=20)
        assert env.ok and seen(rt.redis, past) == [1, 2]

        absurd = rt.submit("pay", {"mode": "absurd_not_before"}).operation_ref
        env = rt.wait(absurd, timeout=20)
        assert not env.ok and env.code == "RETRY_BEYOND_DEADLINE"
        assert env.next_action == "escalate"
        assert rt.get(absurd).state is State.ESCALATED  # type: ignore[union-attr]
    finally:
        stop_processes(procs)


def test_a_sleeping_scheduler_wakes_for_an_earlier_item(rt: ToolQueue) -> None:
    # Given a scheduler with nothing due, sleeping as long as it may (10 s)
    from toolq.services.scheduler.service import Scheduler

    sched = Scheduler(rt.app)
    sched.max_sleep = 10.0
    worker = threading.Thread(target=sched.run, daemon=True)
    worker.start()
    try:
        assert wait_until(lambda: _blocked_in_blpop(rt), 10)
        # When an item falls due in 0.2 s
        ref = _park(rt, 1, "wake", due_in_ms=200)[0]
        # Then it is dispatched then, not when the 10 s sleep ends
        assert wait_until(lambda: rt.get(ref).state is State.QUEUED, 5)  # type: ignore[union-attr]
    finally:
        sched.stop()
        worker.join(timeout=10)
        sched.close()
    assert not worker.is_alive()


def test_a_drain_that_finds_its_script_gone_recovers_without_doubling(
    rt: ToolQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given more items due than one batch, and a server that loses the scripts just as
    # the drain starts (as after FUNCTION FLUSH, or a restart without persistence)
    refs = _park(rt, 1200, "noscript")
    real = rt.ledger.load_scripts
    lost: list[str] = []

    def first_time_lost() -> None:
        real()
        if not lost:
            lost.append("apply")
            rt.redis.function_delete(scripts.LIBRARY)

    monkeypatch.setattr(rt.ledger, "load_scripts", first_time_lost)
    sched = Scheduler(rt.app)
    t = threading.Thread(target=sched.run, daemon=True)
    t.start()
    try:
        # Then the scheduler keeps running, and every item is dispatched once
        assert wait_until(lambda: _dispatches_per_ref(rt, refs) == {1}, 30, interval=0.5)
    finally:
        sched.stop()
        t.join(10)
    assert lost == ["apply"] and not t.is_alive()
    assert _dispatched(rt) == 1200


def test_a_scheduler_waits_out_an_unexpected_error_in_a_round(
    rt: ToolQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a round that fails three times for a reason toolq did not expect (a bug)
    ref = _park(rt, 1, "fault")[0]
    sched = Scheduler(rt.app)
    real = sched._take
    failures = [KeyError("a bug")] * 3

    def take() -> object:
        if failures:
            raise failures.pop()
        return real()

    monkeypatch.setattr(sched, "_take", take)
    caplog.set_level("INFO", logger="toolq.scheduler")
    t = threading.Thread(target=sched.run, daemon=True)
    t.start()
    try:
        # Then the same run() goes on and dispatches the item once the rounds work again
        assert wait_until(lambda: rt.get(ref).state is State.QUEUED, 20)  # type: ignore[union-attr]
        assert t.is_alive()
    finally:
        sched.stop()
        t.join(10)
        sched.close()
    said = [r for r in caplog.records if "scheduler rounds" in r.getMessage()]
    assert [r.getMessage().split(" (")[0].rstrip("0123456789 s") for r in said] == [
        "scheduler rounds failing",
        "scheduler rounds back after",
    ], said
    assert said[0].exc_info is not None  # the traceback, once
