"""The operator's actions as pure transitions (toolq.decisions.recovery.operator), as tables.

Retry now and verify now beside approve and cancel: from which states each one
goes, what it changes, what it guards, and what it refuses. Real workers carry
them out in tests/integration/test_operator_actions.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from toolq.core import errors
from toolq.core.envelope import ToolError
from toolq.core.states import State
from toolq.decisions.recovery import operator, outcome
from toolq.decisions.recovery.transition import Transition

NOW = 1_800_000_000_000
POLICY = outcome.Policy(
    unclaimed_after_ms=1000, approval_timeout_ms=50_000, input_timeout_ms=50_000, retention_s=60
)
MESSAGES = outcome.Messages(
    run=lambda ref, attempt: ("calls", f"run:{ref}:{attempt}"),
    verify=lambda ref, attempt, vcheck: ("verify", f"verify:{ref}:{attempt}:{vcheck}"),
)


def view(state: State, **kw: Any) -> operator.View:
    base = operator.View(
        ref="r",
        state=state,
        tool="write",
        call_id="c",
        fp="f1",
        blocked_fp="",
        attempt=1,
        max_attempts=3,
        rev="7",
        deadline_ms=0,
    )
    return replace(base, **kw)


def retry_now(v: operator.View, now: int = NOW) -> Transition:
    return operator.retry_now(v, now, POLICY, MESSAGES, "operator:alice")


def verify_now(v: operator.View, now: int = NOW) -> Transition:
    return operator.verify_now(v, now, POLICY, MESSAGES, "operator:bob")


# --------------------------------------------------------------------------- retry now


def test_retry_now_is_the_schedulers_dispatch_made_early() -> None:
    t = retry_now(view(State.WAITING_RETRY))

    assert (t.states, t.to, t.by, t.code) == (
        (State.WAITING_RETRY,),
        State.QUEUED,
        "operator:alice",
        "RETRY_NOW",
    )
    # one more attempt counted, published under the same ref, atomically with the move
    assert (t.attempt_incr, t.push) == (1, ("calls", "run:r:2"))
    # bound to the revision the operator read
    assert t.expect == {"*": {"rev": "7"}}
    # the scheduler looks again once the message should have been claimed
    assert t.due_ms == NOW + POLICY.unclaimed_after_ms
    assert t.set == {"repubs": "0"} and t.stats == ("dispatched", "retried_now")


@pytest.mark.parametrize(
    ("budget", "code"),
    [
        ({"attempt": 3, "max_attempts": 3}, "ATTEMPTS_EXHAUSTED"),
        ({"deadline_ms": NOW - 1}, "DEADLINE_EXCEEDED"),
    ],
)
def test_retry_now_past_the_budget_escalates(budget: dict[str, int], code: str) -> None:
    t = retry_now(view(State.WAITING_RETRY, **budget))

    assert (t.to, t.code, t.push, t.attempt_incr) == (State.ESCALATED, code, None, 0)
    assert isinstance(t.envelope, ToolError) and t.envelope.next_action == "escalate"
    assert t.remove_due and t.expect == {"*": {"rev": "7"}}


@pytest.mark.parametrize("state", [s for s in State if s is not State.WAITING_RETRY])
def test_retry_now_only_from_waiting_retry(state: State) -> None:
    with pytest.raises(errors.InvalidState, match=f"operation is {state}, not waiting_retry"):
        retry_now(view(state))


# --------------------------------------------------------------------------- verify now


@pytest.mark.parametrize(
    ("held", "why"),
    [
        ({}, "no check claimed"),
        ({"vholder": "w:1", "vlease_until_ms": NOW - 1}, "a verifier died holding it"),
        ({"vholder": "w:1", "vlease_until_ms": NOW}, "its lease ends now"),
    ],
)
def test_verify_now_publishes_the_next_check(held: dict[str, Any], why: str) -> None:
    v = view(State.VERIFYING, vcheck=2, **held)

    t = verify_now(v)

    assert (t.states, t.to, t.quiet, t.code) == (
        (State.VERIFYING,),
        State.VERIFYING,
        False,  # a history entry: who asked, when
        "VERIFY_NOW",
    ), why
    assert t.push == ("verify", "verify:r:1:3") and t.set == {"vcheck": "3"}
    assert t.attempt_incr == 0  # verification is not an attempt
    # a check claimed since the read (no rev change) refuses it: vholder is guarded
    assert t.expect == {"*": {"rev": "7", "vcheck": "2", "vholder": v.vholder}}
    assert t.delete == ("vholder", "vlease_until")
    assert t.due_ms == NOW + POLICY.unclaimed_after_ms
    assert t.stats == ("verify_published", "verified_now")


def test_verify_now_is_refused_while_a_check_runs() -> None:
    v = view(State.VERIFYING, vcheck=2, vholder="w:1", vlease_until_ms=NOW + 1)

    with pytest.raises(errors.InvalidState, match="check of this operation is running"):
        verify_now(v)


@pytest.mark.parametrize("state", [s for s in State if s is not State.VERIFYING])
def test_verify_now_only_from_verifying(state: State) -> None:
    with pytest.raises(errors.InvalidState, match=f"operation is {state}, not verifying"):
        verify_now(view(state))


def test_verify_now_ignores_the_budget() -> None:
    # Invariant 2: an unknown outcome is verified whatever the budget says.
    t = verify_now(view(State.VERIFYING, attempt=3, max_attempts=3, deadline_ms=NOW - 1))
    assert t.to is State.VERIFYING and t.push is not None


# --------------------------------------------------------------------------- the view


def test_the_view_reads_the_verification_fields() -> None:
    f = {"state": "verifying", "tool": "t", "vcheck": "4", "vholder": "w", "vlease_until": "9.0"}

    v = operator.View.from_fields("r", f)

    assert (v.vcheck, v.vholder, v.vlease_until_ms) == (4, "w", 9)
    assert {"vcheck", "vholder", "vlease_until"} <= set(operator.FIELDS)


def test_approve_and_input_keep_their_guards() -> None:
    approve = operator.approve(view(State.AWAITING_APPROVAL), NOW, POLICY, MESSAGES)
    assert approve.expect == {"*": {"rev": "7", "fp": "f1"}} and approve.stats == ()
    fix = operator.provide_input(
        view(State.NEEDS_INPUT, blocked_fp="f0"), "{}", "f2", NOW, POLICY, MESSAGES
    )
    assert fix.expect == {"*": {"rev": "7", "blocked_fp": "f0"}}
