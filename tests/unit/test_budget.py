"""The attempts-and-deadline budget (issue 12): one check, one order, every path.

- ``check`` alone, as a table with rows for every path;
- the real decision functions, one row per path, each asked with a budget
  that is fine, past its deadline, spent, and both: whatever a function
  does, it agrees with ``check`` (so no path decides the budget by itself);
- the claim, the operator actions and the scheduler through the real ledger
  scripts on fakeredis with an injected clock;
- a property: every decision that ends ``escalated`` has an envelope that
  says ``next_action: escalate`` and that a person will look at it.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from toolq import CallContext, State, ToolQueue
from toolq.core import errors
from toolq.core.envelope import Directive, NextAction, ToolError
from toolq.core.settings import RecoverySettings, ToolqSettings
from toolq.core.tools import Tool
from toolq.decisions.recovery import actions, operator, outcome
from toolq.decisions.recovery.budget import (
    Budget,
    Path,
    Verdict,
    cap_retry,
    check,
    wake_by,
)
from toolq.decisions.recovery.policy import Queues, Snapshot, Timeouts, decide
from toolq.decisions.recovery.transition import Transition
from toolq.services.scheduler.service import Scheduler

NOW = 10_000_000
DL = NOW  # a deadline at NOW: still within it (the check is now > deadline)
GO, LATE, SPENT, BEYOND = (
    Verdict.GO,
    Verdict.DEADLINE_EXCEEDED,
    Verdict.ATTEMPTS_EXHAUSTED,
    Verdict.RETRY_BEYOND_DEADLINE,
)

# ---------------------------------------------------------------- check() alone

# path, attempt, max_attempts, deadline_ms, not_before_ms, verdict (at NOW)
TABLE: list[tuple[Path, int, int, int, int | None, Verdict]] = [
    (Path.SUBMIT, 0, 1, DL, None, GO),
    (Path.SUBMIT, 0, 1, DL - 1, None, LATE),
    # a claim serves the attempt already counted: the last one may run
    (Path.CLAIM, 3, 3, DL, None, GO),
    (Path.CLAIM, 1, 3, DL - 1, None, LATE),
    (Path.CLAIM, 4, 3, DL, None, SPENT),
    (Path.DISPATCH, 2, 3, DL, None, GO),
    (Path.DISPATCH, 3, 3, DL, None, SPENT),
    (Path.DISPATCH, 1, 3, DL - 1, None, LATE),
    # a republish sends the same attempt again: it needs no new one
    (Path.REPUBLISH, 3, 3, DL, None, GO),
    (Path.REPUBLISH, 1, 3, DL - 1, None, LATE),
    (Path.APPROVE, 0, 1, DL, None, GO),
    (Path.APPROVE, 1, 1, DL, None, SPENT),
    (Path.APPROVE, 0, 1, DL - 1, None, LATE),
    (Path.PROVIDE_INPUT, 1, 2, DL, None, GO),
    (Path.PROVIDE_INPUT, 2, 2, DL, None, SPENT),
    (Path.PROVIDE_INPUT, 1, 2, DL - 1, None, LATE),
    (Path.LEASE_LOST, 1, 2, DL, None, GO),
    (Path.LEASE_LOST, 2, 2, DL, None, SPENT),
    (Path.LEASE_LOST, 1, 2, DL - 1, None, LATE),
    (Path.NOT_FOUND, 1, 2, DL, None, GO),
    (Path.NOT_FOUND, 2, 2, DL, None, SPENT),
    (Path.NOT_FOUND, 1, 2, DL - 1, None, LATE),
    (Path.RETRY, 1, 2, DL, DL, GO),
    (Path.RETRY, 1, 2, DL, DL + 1, BEYOND),
    # one order everywhere: deadline, then attempts, then the retry's start
    (Path.RETRY, 2, 2, DL, DL + 1, SPENT),
    (Path.RETRY, 2, 2, DL - 1, DL + 1, LATE),
    (Path.DISPATCH, 3, 3, DL - 1, None, LATE),
    (Path.NOT_FOUND, 2, 2, DL - 1, None, LATE),
    # no deadline: only attempts count
    (Path.DISPATCH, 1, 3, 0, None, GO),
    (Path.RETRY, 1, 3, 0, NOW * 10, GO),
]


@pytest.mark.parametrize(
    ("path", "attempt", "max_attempts", "deadline", "not_before", "verdict"),
    TABLE,
    ids=[f"{row[0]}-{row[5]}" for row in TABLE],
)
def test_check(
    path: Path,
    attempt: int,
    max_attempts: int,
    deadline: int,
    not_before: int | None,
    verdict: Verdict,
) -> None:
    b = Budget(attempt, max_attempts, deadline)
    assert check(b, path, NOW, not_before_ms=not_before) is verdict


def test_the_table_has_rows_for_every_path_and_verdict() -> None:
    assert {row[0] for row in TABLE} == set(Path)
    assert {row[5] for row in TABLE} == set(Verdict)


@given(
    max_attempts=st.integers(1, 100), deadline_s=st.floats(0.001, 1e7), now=st.integers(0, 2**41)
)
def test_a_fresh_submit_is_always_within_its_budget(
    max_attempts: int, deadline_s: float, now: int
) -> None:
    """Submit creates the budget (deadline = now + the tool's deadline > 0, at
    least one attempt), so it cannot refuse; the first attempt is checked at claim."""
    b = Budget(0, max_attempts, now + max(1, int(deadline_s * 1000)))
    assert check(b, Path.SUBMIT, now) is GO


@pytest.mark.parametrize(
    ("deadline", "due", "expected"),
    [(0, NOW + 5, NOW + 5), (NOW + 10, NOW + 5, NOW + 5), (NOW + 10, NOW + 50, NOW + 11)],
)
def test_wake_by_the_deadline(deadline: int, due: int, expected: int) -> None:
    assert wake_by(Budget(1, 3, deadline), due) == expected


@pytest.mark.parametrize(
    ("deadline", "due", "not_before", "expected"),
    [
        (0, NOW + 50, NOW, NOW + 50),
        (NOW + 100, NOW + 50, NOW, NOW + 50),
        # jitter does not push a retry that fits past the deadline
        (NOW + 100, NOW + 150, NOW + 90, NOW + 100),
        (NOW + 100, NOW + 150, NOW + 100, NOW + 100),
    ],
)
def test_jitter_stops_at_the_deadline(
    deadline: int, due: int, not_before: int, expected: int
) -> None:
    assert cap_retry(Budget(1, 3, deadline), due, not_before) == expected


# ---------------------------------------------------------------- the real decision functions

POLICY = outcome.Policy(
    unclaimed_after_ms=1000, approval_timeout_ms=50_000, input_timeout_ms=50_000, retention_s=60
)
MESSAGES = outcome.Messages(
    run=lambda ref, attempt: ("calls", f"run:{ref}:{attempt}"),
    verify=lambda ref, attempt, vcheck: ("verify", f"verify:{ref}:{attempt}:{vcheck}"),
)
TIMEOUTS = Timeouts(unclaimed_after_ms=1000, approval_timeout_ms=50_000, input_timeout_ms=50_000)


class Args(BaseModel):
    n: int = 0


_tq = ToolQueue(redis_url="redis://unused/0")


@_tq.tool(name="write", writes=True, max_attempts=3)
def _write(args: Args, ctx: CallContext) -> str:
    return "done"


@_write.verifier
def _find(ctx: CallContext) -> str | None:
    return None


@_tq.tool(name="blind_write", writes=True, max_attempts=3)
def _blind_write(args: Args, ctx: CallContext) -> str:
    return "done"


@_tq.tool(name="read", writes=False, max_attempts=3)
def _read(args: Args, ctx: CallContext) -> str:
    return "read"


WRITE, BLIND, READ = (_tq.registry.get(n) for n in ("write", "blind_write", "read"))


def snap(state: State, b: Budget, **kw: Any) -> Snapshot:
    fields: dict[str, Any] = dict(
        ref="r",
        state=state,
        tool=kw.pop("tool", "write"),
        attempt=b.attempt,
        max_attempts=b.max_attempts,
        deadline_ms=b.deadline_ms,
        lease_until_ms=0,
        entered_ms=NOW,
        vlease_until_ms=0,
        vholder="",
        vcheck=1,
        retry_due_ms=0,
        repubs=0,
        rev=7,
    )
    fields.update(kw)
    return Snapshot(**fields)


def attempt_of(b: Budget, tool: Tool[Any] = WRITE) -> outcome.Attempt:
    return outcome.Attempt(
        ref="r",
        tool=tool,
        call_id="c",
        attempt=b.attempt,
        max_attempts=b.max_attempts,
        deadline_ms=b.deadline_ms,
        fp="f",
        vcheck=1,
        holder="h:1:x",
    )


def check_of(b: Budget, tool: Tool[Any] = WRITE, vfail: int = 0) -> outcome.Check:
    return outcome.Check(
        ref="r",
        tool=tool,
        call_id="c",
        attempt=b.attempt,
        max_attempts=b.max_attempts,
        deadline_ms=b.deadline_ms,
        vcheck=1,
        vfail=vfail,
        uncertain_at_ms=0,  # the consistency window is long past
        holder="v:1:x",
    )


def view_of(b: Budget, state: State) -> operator.View:
    return operator.View(
        ref="r",
        state=state,
        tool="write",
        call_id="c",
        fp="f1",
        blocked_fp="f1",
        attempt=b.attempt,
        max_attempts=b.max_attempts,
        rev="7",
        deadline_ms=b.deadline_ms,
    )


def lost_of(b: Budget, tool: Tool[Any] | None) -> outcome.Lost:
    return outcome.Lost(
        ref="r",
        tool=tool,
        tool_name=tool.name if tool else "gone",
        call_id="c",
        attempt=b.attempt,
        max_attempts=b.max_attempts,
        deadline_ms=b.deadline_ms,
        vcheck=1,
        expect={"*": {"rev": "7"}},
        by="test",
    )


def scheduled(s: Snapshot, now: int, tool: Tool[Any] | None = WRITE) -> Transition | None:
    d = decide(s, now, TIMEOUTS, Queues())
    return actions.for_decision(d, s, tool, "c", now, POLICY, MESSAGES)


def _claim(b: Budget, now: int) -> Transition | None:
    return outcome.before_call(attempt_of(b), now, POLICY)


def _dispatch(b: Budget, now: int) -> Transition | None:
    return scheduled(snap(State.WAITING_RETRY, b, retry_due_ms=now), now)


def _republish(b: Budget, now: int) -> Transition | None:
    return scheduled(snap(State.QUEUED, b, published_ms=now - 5000), now)


def _approve(b: Budget, now: int) -> Transition | None:
    return operator.approve(view_of(b, State.AWAITING_APPROVAL), now, POLICY, MESSAGES)


def _provide_input(b: Budget, now: int) -> Transition | None:
    v = view_of(b, State.NEEDS_INPUT)
    return operator.provide_input(v, '{"n":2}', "f2", now, POLICY, MESSAGES)


def _lease_lost(b: Budget, now: int) -> Transition | None:
    s = snap(State.RUNNING, b, tool="read", lease_until_ms=now - 1)
    return scheduled(s, now, READ)


def _not_found(b: Budget, now: int) -> Transition | None:
    return outcome.verified_not_found(check_of(b), now, POLICY, MESSAGES)


def _retry(b: Budget, now: int) -> Transition | None:
    exc = errors.RateLimited(retry_after=0.5)
    return outcome.after_failure(attempt_of(b), exc, now, POLICY, MESSAGES, random.Random(1))


Runner = Callable[[Budget, int], Transition | None]
#: path -> (the real function, the state it leaves in when the budget allows)
REAL: dict[Path, tuple[Runner, State | None]] = {
    Path.CLAIM: (_claim, None),  # None: go ahead and call the tool
    Path.DISPATCH: (_dispatch, State.QUEUED),
    Path.REPUBLISH: (_republish, State.QUEUED),
    Path.APPROVE: (_approve, State.QUEUED),
    Path.PROVIDE_INPUT: (_provide_input, State.QUEUED),
    Path.LEASE_LOST: (_lease_lost, State.QUEUED),
    Path.NOT_FOUND: (_not_found, State.QUEUED),
    Path.RETRY: (_retry, State.WAITING_RETRY),
}

BUDGETS = {
    "fine": Budget(1, 3, NOW + 60_000),
    "late": Budget(1, 3, NOW - 1),
    "spent": Budget(3, 3, NOW + 60_000),
    "late_and_spent": Budget(3, 3, NOW - 1),
    "no_deadline": Budget(1, 3, 0),
}


def test_every_path_but_submit_has_a_real_row() -> None:
    # SUBMIT creates the budget (test_a_fresh_submit_is_always_within_its_budget).
    assert set(REAL) == set(Path) - {Path.SUBMIT}


@pytest.mark.parametrize("budget", BUDGETS, ids=list(BUDGETS))
@pytest.mark.parametrize("path", REAL, ids=[str(p) for p in REAL])
def test_every_path_decides_as_the_budget_does(path: Path, budget: str) -> None:
    b = BUDGETS[budget]
    run, allowed_to = REAL[path]
    verdict = check(b, path, NOW)
    t = run(b, NOW)
    if verdict.ok:
        assert (t.to if t is not None else None) is allowed_to
        if t is not None and t.due_ms is not None and b.deadline_ms:
            assert t.due_ms <= b.deadline_ms + 1  # the scheduler looks again by the deadline
        return
    assert t is not None and t.to is State.ESCALATED
    assert isinstance(t.envelope, ToolError)
    assert (t.code, t.envelope.code) == (verdict.value, verdict.value)
    assert t.envelope.next_action is NextAction.ESCALATE
    assert t.remove_due and t.push is None  # settled: nothing published, nothing due


def test_a_retry_that_would_start_after_the_deadline_escalates_at_once() -> None:
    b = Budget(1, 3, NOW + 1000)
    exc = errors.RateLimited(retry_after=5.0)
    t = outcome.after_failure(attempt_of(b), exc, NOW, POLICY, MESSAGES, random.Random(1))
    assert t.to is State.ESCALATED and t.code == "RETRY_BEYOND_DEADLINE"


def test_a_retry_within_the_deadline_is_not_jittered_past_it() -> None:
    b = Budget(1, 3, NOW + 1000)
    exc = errors.RateLimited(retry_after=1.0)  # not_before exactly at the deadline
    for seed in range(50):
        t = outcome.after_failure(attempt_of(b), exc, NOW, POLICY, MESSAGES, random.Random(seed))
        assert t.to is State.WAITING_RETRY and t.due_ms == NOW + 1000


@pytest.mark.parametrize("budget", ["late", "spent", "late_and_spent"])
def test_an_unknown_write_is_verified_whatever_the_budget(budget: str) -> None:
    """Verification is not an attempt (invariant 2): only the re-queue after it is budgeted."""
    b = BUDGETS[budget]
    a = attempt_of(b)
    t = outcome.after_failure(a, TimeoutError("x"), NOW, POLICY, MESSAGES, random.Random(1))
    assert t.to is State.VERIFYING and t.push is not None and t.push[0] == "verify"
    swept = outcome.lease_lost(lost_of(b, WRITE), NOW, POLICY, MESSAGES)
    assert swept.to is State.VERIFYING


# ---------------------------------------------------------------- through the ledger (fakeredis)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _app(fake_redis: fakeredis.FakeRedis, clock: Clock) -> tuple[ToolQueue, list[int]]:
    tq = ToolQueue(
        redis_url="redis://unit/0",
        settings=ToolqSettings(recovery=RecoverySettings(unclaimed_after=5)),
        clock=clock,
    )
    tq.app._redis = fake_redis
    calls: list[int] = []

    @tq.tool(writes=True, deadline=1.0, max_attempts=3)
    def pay(args: Args, ctx: CallContext) -> str:
        calls.append(ctx.attempt)
        if args.n < 0:
            raise errors.InvalidInput(field="n", rule="positive")
        return "paid"

    @pay.verifier
    def find(ctx: CallContext) -> str | None:
        return None

    @tq.tool(writes=True, deadline=1.0, requires_approval=True)
    def transfer(args: Args, ctx: CallContext) -> str:
        calls.append(ctx.attempt)
        return "sent"

    return tq, calls


def _deliver(tq: ToolQueue) -> str:
    raw = tq.redis.rpop(tq.settings.queues.calls)
    assert isinstance(raw, bytes), "no message to deliver"
    ref, attempt = json.loads(base64.b64decode(json.loads(raw)["body"]))[0][:2]
    return tq.runtime.run_attempt(ref, int(attempt))


def _history(tq: ToolQueue, ref: str) -> list[tuple[State | None, State, str | None]]:
    rec = tq.get(ref)
    assert rec is not None
    return [(h.from_, h.to, h.code) for h in rec.history]


def test_a_claim_past_the_deadline_never_calls_the_tool(fake_redis: fakeredis.FakeRedis) -> None:
    clock = Clock()
    tq, calls = _app(fake_redis, clock)
    ref = tq.submit("pay", {"n": 1}).operation_ref
    clock.now += 1.001  # delivered late: one ms past the deadline
    assert _deliver(tq) == "escalated"
    assert calls == []
    assert _history(tq, ref)[-2:] == [
        (State.QUEUED, State.RUNNING, None),
        (State.RUNNING, State.ESCALATED, "DEADLINE_EXCEEDED"),
    ]
    env = tq.ledger.envelope(ref)
    assert isinstance(env, ToolError) and env.next_action is NextAction.ESCALATE


def test_a_claim_at_the_deadline_runs(fake_redis: fakeredis.FakeRedis) -> None:
    clock = Clock()
    tq, calls = _app(fake_redis, clock)
    tq.submit("pay", {"n": 1})
    clock.now += 1.0
    assert _deliver(tq) == "succeeded" and calls == [1]


def test_operator_actions_past_the_deadline_escalate(fake_redis: fakeredis.FakeRedis) -> None:
    clock = Clock()
    tq, calls = _app(fake_redis, clock)
    approval = tq.submit("transfer", {"n": 1}).operation_ref
    needs_input = tq.submit("pay", {"n": -1}).operation_ref
    assert _deliver(tq) == "needs_input" and calls == [1]
    clock.now += 1.5
    assert tq.approve(approval) is State.ESCALATED
    assert tq.provide_input(needs_input, {"n": 2}) is State.ESCALATED
    for ref in (approval, needs_input):
        env = tq.ledger.envelope(ref)
        assert isinstance(env, ToolError) and env.code == "DEADLINE_EXCEEDED"
    assert tq.redis.llen(tq.settings.queues.calls) == 0  # nothing was published
    assert calls == [1]


def test_the_scheduler_escalates_a_queued_operation_past_its_deadline(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    clock = Clock()
    tq, calls = _app(fake_redis, clock)
    ref = tq.submit("pay", {"n": 1}).operation_ref
    sched = Scheduler(tq.app)
    clock.now += 5.0  # its first due time; the message still waits in the queue
    sched.tick()
    assert _history(tq, ref)[-1] == (State.QUEUED, State.ESCALATED, "DEADLINE_EXCEEDED")
    # The message still in the queue is refused by the claim: the tool is never called.
    assert _deliver(tq) == "stale" and calls == []


def test_a_record_the_scheduler_cannot_decide_does_not_hold_back_its_batch(
    fake_redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two operations past their deadline, one with a call_id no envelope can carry
    # (what tq.submit took before it checked: such records may be in a ledger already)
    clock = Clock()
    tq, _ = _app(fake_redis, clock)
    bad, good = (tq.submit("pay", {"n": 1}).operation_ref for _ in range(2))
    tq.redis.hset(tq.ledger.keys_of(bad).op(bad), "call_id", "line\nbreak")
    clock.now += 5.0

    # When the scheduler takes them in one batch, and the bad one again in the next
    scheduler = Scheduler(tq.app)
    scheduler.tick()
    clock.now += tq.settings.scheduler.hold + 1  # its hold over: taken again
    scheduler.tick()

    # Then the other one is escalated, and the one it cannot decide is said by its ref
    # once (the batch raised: no item of it was handled, round after round)
    assert _history(tq, good)[-1] == (State.QUEUED, State.ESCALATED, "DEADLINE_EXCEEDED")
    assert tq.ledger.fields(bad, "state")["state"] == State.QUEUED
    said = [r.getMessage() for r in caplog.records if r.name == "toolq.scheduler"]
    assert said == [f"scheduler: {bad} (escalate) passed over: its transition failed"]


# ---------------------------------------------------------------- escalated envelopes say so

FAILURES: list[Callable[[], BaseException]] = [
    lambda: errors.InvalidInput(field="n", rule="positive"),
    errors.NeedsApproval,
    errors.ForbiddenScope,
    errors.NotFound,
    errors.Conflict,
    lambda: errors.RateLimited(retry_after=0.5),
    lambda: errors.RateLimited(retry_after=3600.0),
    errors.Unavailable,
    errors.OutcomeUnknown,
    errors.Misconfigured,
    lambda: RuntimeError("boom"),
    lambda: TimeoutError("read timed out"),
    lambda: ConnectionResetError("reset"),
]


def every_decision(b: Budget, now: int, failure: BaseException, vfail: int) -> list[Transition]:
    """What every outcome, verdict, scheduler and operator function decides for one budget."""
    out: list[Transition | None] = []
    for tool in (WRITE, BLIND, READ):
        a = attempt_of(b, tool)
        out.append(outcome.before_call(a, now, POLICY))
        out.append(outcome.after_failure(a, failure, now, POLICY, MESSAGES, random.Random(0)))
        out.append(outcome.lease_lost(lost_of(b, tool), now, POLICY, MESSAGES))
    out.append(outcome.lease_lost(lost_of(b, None), now, POLICY, MESSAGES))
    c = check_of(b, WRITE, vfail)
    out += [outcome.verified_not_found(c, now, POLICY, MESSAGES)]
    out += [outcome.verifier_failed(c, now, POLICY)]
    for state in State:
        s = snap(state, b, retry_due_ms=now, published_ms=now - 5000, entered_ms=0)
        out.append(scheduled(s, now))
    out.append(_approve(b, now))
    out.append(_provide_input(b, now))
    return [t for t in out if t is not None]


@settings(max_examples=150, deadline=None)
@given(
    attempt=st.integers(0, 4),
    max_attempts=st.integers(1, 4),
    deadline=st.sampled_from([0, NOW - 1, NOW, NOW + 500, NOW + 10**7]),
    failure=st.sampled_from(FAILURES),
    vfail=st.integers(0, 6),
)
def test_every_escalated_envelope_says_escalate(
    attempt: int,
    max_attempts: int,
    deadline: int,
    failure: Callable[[], BaseException],
    vfail: int,
) -> None:
    b = Budget(attempt, max_attempts, deadline)
    escalated = [t for t in every_decision(b, NOW, failure(), vfail) if t.to is State.ESCALATED]
    assert escalated  # at least the approval/input timeouts and the unknown tool
    for t in escalated:
        env = t.envelope
        assert isinstance(env, ToolError), t
        assert env.next_action is NextAction.ESCALATE, (t.code, env.code)
        assert env.retry.directive is Directive.NEVER
        assert "person" in env.user_message, env.code
        assert t.remove_due and t.ttl == POLICY.retention_s


def test_a_write_without_a_verifier_says_nothing_will_verify_it() -> None:
    a = attempt_of(Budget(1, 3, NOW + 60_000), BLIND)
    t = outcome.after_failure(a, TimeoutError("x"), NOW, POLICY, MESSAGES, random.Random(0))
    assert t.to is State.ESCALATED
    env = t.envelope
    assert isinstance(env, ToolError)
    assert (env.code, env.commit_state, env.next_action) == (
        "OUTCOME_UNVERIFIABLE",
        "unknown",
        NextAction.ESCALATE,
    )
    assert env.safe_details == {"reason": "OUTCOME_UNKNOWN"}
    assert "verifies" not in env.agent_message
    assert set(t.stats) >= {"unknown", "escalated", "no_verifier"}
