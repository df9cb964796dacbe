"""The deadline on every path (issue 12, invariant 6), with a real server and
real worker and scheduler processes.

The tools (``apps/deadline_app.py``) count their calls in the same Redis. Those
whose attempt 1 must start before the deadline have a long one, which the test
ends once that attempt has run (:func:`end_deadline`), so a loaded machine
cannot make the attempt late; the others have a deadline of one second. Each
test starts the processes it needs, on a database of its own, and waits for
the deadline to pass on the clock (a condition, not a sleep) before the step
that must see it passed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.helpers import (
    kill_group,
    start_scheduler,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import deadline_app
from tests.integration.apps.deadline_app import APP, calls
from toolq import State, ToolQueue
from toolq.core.envelope import NextAction, ToolError

Starter = Callable[[str, str], subprocess.Popen[bytes]]


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    app = deadline_app.tq
    app.configure(redis_url=redis_url)
    yield app
    app.close()


@contextmanager
def running(redis_url: str, *starters: Starter) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [start(APP, redis_url) for start in starters]
    try:
        yield procs
    finally:
        stop_processes(procs, timeout=5)


def calls_worker(app: str, redis_url: str) -> subprocess.Popen[bytes]:
    return start_worker(app, redis_url, queues=deadline_app.tq.settings.queues.calls)


def verify_worker(app: str, redis_url: str) -> subprocess.Popen[bytes]:
    return start_worker(app, redis_url, queues=deadline_app.tq.settings.queues.verify)


def past_deadline(tq: ToolQueue, ref: str) -> None:
    """Wait on the clock until the operation's deadline has passed."""
    deadline_ms = int(tq.ledger.fields(ref, "deadline")["deadline"])
    assert wait_until(lambda: time.time() * 1000 > deadline_ms + 5, 10, interval=0.02)


def end_deadline(tq: ToolQueue, ref: str) -> None:
    """End the operation's deadline now, and wait on the clock until it has passed.

    The record's ``deadline`` field is what every step reads (a claim, the
    scheduler, an operator's call): moving it is the deadline passing, at the
    point of the test that needs it, after the steps that must come before it.
    """
    tq.redis.hset(tq.ledger.keys_of(ref).op(ref), "deadline", int(time.time() * 1000))
    past_deadline(tq, ref)


def steps(tq: ToolQueue, ref: str) -> list[tuple[State | None, State, str | None]]:
    rec = tq.get(ref)
    assert rec is not None
    return [(h.from_, h.to, h.code) for h in rec.history]


def assert_escalated(env: object, code: str = "DEADLINE_EXCEEDED") -> None:
    assert isinstance(env, ToolError), env
    assert (env.code, env.next_action) == (code, NextAction.ESCALATE)
    assert env.commit_state == "not_committed"


def test_a_queued_operation_past_its_deadline_with_no_worker_escalates(
    tq: ToolQueue, redis_url: str
) -> None:
    # Given a write submitted while no worker runs, and a scheduler
    with running(redis_url, start_scheduler):
        ref = tq.submit("pay", {}).operation_ref
        # When its deadline passes, unclaimed: Then the scheduler escalates it
        # instead of publishing it again
        env = tq.wait(ref, timeout=30)
    assert_escalated(env)
    assert steps(tq, ref) == [
        (None, State.QUEUED, None),
        (State.QUEUED, State.ESCALATED, "DEADLINE_EXCEEDED"),
    ]
    rec = tq.get(ref)
    assert rec is not None and rec.history[-1].by == "scheduler"
    assert calls(tq.redis, ref) == 0  # no side effect: nothing ever ran it


def test_a_claim_past_the_deadline_never_calls_the_tool(tq: ToolQueue, redis_url: str) -> None:
    # Given a write whose message waits, unclaimed, past its deadline (no scheduler)
    ref = tq.submit("pay", {}).operation_ref
    past_deadline(tq, ref)
    # When a worker comes and takes the late message
    with running(redis_url, start_worker):
        env = tq.wait(ref, timeout=30)
    # Then it claims it and escalates it without calling the tool
    assert_escalated(env)
    assert steps(tq, ref) == [
        (None, State.QUEUED, None),
        (State.QUEUED, State.RUNNING, None),
        (State.RUNNING, State.ESCALATED, "DEADLINE_EXCEEDED"),
    ]
    assert calls(tq.redis, ref) == 0


def test_approve_and_input_past_the_deadline_escalate(tq: ToolQueue, redis_url: str) -> None:
    with running(redis_url, start_worker):
        # Given one write awaiting approval and one that needs input
        approval = tq.submit("transfer", {}).operation_ref
        fix = tq.submit("charge", {"n": -1}).operation_ref
        assert tq.wait(fix, timeout=30).code == "INVALID_INPUT"  # type: ignore[union-attr]
        assert tq.wait(approval, timeout=1).code == "MISSING_APPROVAL"  # type: ignore[union-attr]
        past_deadline(tq, approval)
        end_deadline(tq, fix)
        # When an operator approves, or supplies changed arguments, too late
        assert tq.approve(approval) is State.ESCALATED
        assert tq.provide_input(fix, {"n": 5}) is State.ESCALATED
        # Then both escalate at once: no attempt is queued for the worker
        assert tq.redis.llen(tq.settings.queues.calls) == 0
    for ref, by in ((approval, "operator:approve"), (fix, "operator:input")):
        assert_escalated(tq.ledger.envelope(ref))
        rec = tq.get(ref)
        assert rec is not None and rec.history[-1].by == by
    assert (calls(tq.redis, approval), calls(tq.redis, fix)) == (0, 1)


def test_a_read_whose_worker_died_past_the_deadline_is_not_run_again(
    tq: ToolQueue, redis_url: str
) -> None:
    with running(redis_url, start_worker, start_scheduler) as (worker, _):
        # Given a long read that is running, its lease renewed past its deadline
        ref = tq.submit("scan", {"sleep": 60}).operation_ref
        assert wait_until(lambda: calls(tq.redis, ref) == 1, 20)
        end_deadline(tq, ref)
        assert tq.get(ref).state is State.RUNNING  # type: ignore[union-attr]
        # When its worker dies: Then the lease sweep escalates it instead of re-running it
        kill_group(worker)
        env = tq.wait(ref, timeout=30)
    assert_escalated(env)
    rec = tq.get(ref)
    assert rec is not None
    last = rec.history[-1]
    assert (last.from_, last.to, last.code, last.by) == (
        State.RUNNING,
        State.ESCALATED,
        "DEADLINE_EXCEEDED",
        "scheduler:lease_sweep",
    )
    assert calls(tq.redis, ref) == 1


def test_a_retry_due_past_the_deadline_is_not_dispatched(tq: ToolQueue, redis_url: str) -> None:
    with running(redis_url, start_worker):
        # Given a read rate limited on attempt 1, waiting while no scheduler runs
        ref = tq.submit("quote", {}).operation_ref
        assert wait_until(lambda: tq.get(ref).state is State.WAITING_RETRY, 20)  # type: ignore[union-attr]
        end_deadline(tq, ref)
        # When a scheduler comes after the deadline
        with running(redis_url, start_scheduler):
            env = tq.wait(ref, timeout=30)
    # Then it escalates the retry instead of dispatching it
    assert_escalated(env)
    assert steps(tq, ref)[-1] == (State.WAITING_RETRY, State.ESCALATED, "DEADLINE_EXCEEDED")
    assert calls(tq.redis, ref) == 1


def test_a_write_verified_not_found_after_its_deadline_is_not_sent_again(
    tq: ToolQueue, redis_url: str
) -> None:
    with running(redis_url, calls_worker, start_scheduler):
        # Given a write whose attempt 1 timed out (outcome unknown), its deadline
        # passed before any verifier looked
        ref = tq.submit("book", {}).operation_ref
        assert wait_until(lambda: tq.get(ref).state is State.VERIFYING, 20)  # type: ignore[union-attr]
        end_deadline(tq, ref)
        # When a verifier finds nothing (believed once the consistency window ended):
        # it is verified whatever its budget
        with running(redis_url, verify_worker):
            env = tq.wait(ref, timeout=30)
    # Then the re-queue is refused by the budget: escalated, never sent again
    assert_escalated(env)
    assert steps(tq, ref)[-1] == (State.VERIFYING, State.ESCALATED, "DEADLINE_EXCEEDED")
    assert (State.RUNNING, State.VERIFYING, "OUTCOME_UNKNOWN") in steps(tq, ref)
    assert calls(tq.redis, ref) == 1
    assert int(tq.redis.get(f"provider:verifications:{ref}") or 0) >= 1
