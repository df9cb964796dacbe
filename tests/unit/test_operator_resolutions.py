"""How a person settles an escalated operation (toolq.decisions.recovery.operator), as
tables: resolved as committed, as not committed, retried under the same ref; and what
each refuses. Real workers carry them out in tests/integration/test_resolutions.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from toolq.core import errors
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.states import State
from toolq.decisions.recovery import operator, outcome
from toolq.decisions.recovery.transition import RESOLUTIONS, Transition

NOW = 1_800_000_000_000
WINDOW = 3_600_000
POLICY = outcome.Policy(
    unclaimed_after_ms=1000,
    approval_timeout_ms=50_000,
    input_timeout_ms=50_000,
    retention_s=60,
    operator_retries=2,
)
MESSAGES = outcome.Messages(
    run=lambda ref, attempt: ("calls", f"run:{ref}:{attempt}"),
    verify=lambda ref, attempt, vcheck: ("verify", f"verify:{ref}:{attempt}:{vcheck}"),
)
S = operator.Settle


def view(state: State = State.ESCALATED, **kw: Any) -> operator.View:
    base = operator.View(
        ref="r",
        state=state,
        tool="write",
        call_id="c",
        fp="f1",
        blocked_fp="",
        attempt=3,
        max_attempts=3,
        rev="7",
        deadline_ms=NOW - 5,  # escalated DEADLINE_EXCEEDED, say
    )
    return replace(base, **kw)


def settle(
    how: operator.Settle,
    v: operator.View | None = None,
    result: Any = None,
    **said: str,
) -> Transition:
    words = {"by": "console:alice", "reason": "checked the provider's dashboard", **said}
    r = operator.Resolution(**words)
    return operator.resolve(
        v or view(), how, NOW, POLICY, MESSAGES, r, result=result, window_ms=WINDOW
    )


# --------------------------------------------------------------------------- the three moves

# how, what was said -> where it goes, code, stats
MOVES = [
    (S.COMMITTED, {"reference": "inv_42"}, State.SUCCEEDED, "RESOLVED_COMMITTED"),
    (S.NOT_COMMITTED, {}, State.FAILED, "RESOLVED_NOT_COMMITTED"),
    (S.RETRY, {}, State.QUEUED, "RESOLVED_RETRY"),
]


@pytest.mark.parametrize(("how", "said", "to", "code"), MOVES)
def test_each_resolution_is_one_guarded_move_out_of_escalated(
    how: operator.Settle, said: dict[str, str], to: State, code: str
) -> None:
    t = settle(how, **said)

    assert (t.states, t.to, t.by, t.code) == ((State.ESCALATED,), to, "console:alice", code)
    assert t.expect == {"*": {"rev": "7"}}  # bound to the revision read
    assert t.stats == (f"resolved_{how.value}",)
    assert code in RESOLUTIONS
    # the history entry keeps why, and where it was seen
    assert t.note == {"reason": "checked the provider's dashboard", **said}


def test_the_note_is_one_line_and_redacts_what_looks_like_a_credential() -> None:
    t = settle(S.NOT_COMMITTED, reason="checked  with\nkey sk-abcdef1234567890abcdef")
    assert "\n" not in t.note["reason"] and "sk-abcdef" not in t.note["reason"]
    assert "reference" not in t.note


def test_committed_says_an_operator_confirmed_it() -> None:
    t = settle(S.COMMITTED, result={"invoice": "inv_42"}, by="cli:bob")

    env = t.envelope
    assert isinstance(env, ToolSuccess) and env.result == {"invoice": "inv_42"}
    assert env.verification.evidence_ref == "operator:cli:bob"
    assert env.operation_ref == "r" and env.call_id == "c"
    # terminal: the due entry goes, the retention TTL is set again
    assert t.remove_due and t.ttl == POLICY.retention_s and t.push is None


def test_committed_with_only_a_reference_returns_the_reference() -> None:
    env = settle(S.COMMITTED, reference="inv_42").envelope
    assert isinstance(env, ToolSuccess) and env.result == {"reference": "inv_42"}


def test_not_committed_fails_for_good_and_says_nothing_was_sent() -> None:
    t = settle(S.NOT_COMMITTED)

    env = t.envelope
    assert isinstance(env, ToolError)
    assert (env.code, env.commit_state, env.retry.directive) == (
        "RESOLVED_NOT_COMMITTED",
        "not_committed",
        "never",
    )
    assert t.remove_due and t.ttl == POLICY.retention_s and t.push is None


def test_retry_is_one_attempt_more_under_the_same_ref() -> None:
    t = settle(S.RETRY, v=view(op_retries=1))

    assert (t.attempt_incr, t.push) == (1, ("calls", "run:r:4"))
    # the operator's attempt: the budget lets exactly it start, in a new deadline window
    assert t.set == {
        "op_retries": "2",
        "max_attempts": "4",
        "deadline": str(NOW + WINDOW),
        "repubs": "0",
    }
    assert t.ttl == 0  # the record lives again: escalated had set its TTL
    assert t.delete == ("envelope",)  # a waiter now waits for the new attempt
    assert t.due_ms == NOW + POLICY.unclaimed_after_ms and not t.remove_due


def test_retry_without_a_deadline_gets_none() -> None:
    t = settle(S.RETRY, v=view(deadline_ms=0))
    assert "deadline" not in t.set and t.due_ms == NOW + POLICY.unclaimed_after_ms


# --------------------------------------------------------------------------- refusals

# how, view changes, what was said, result -> the error, its code hint
REFUSALS: list[tuple[operator.Settle, dict[str, Any], dict[str, str], Any, type, str]] = [
    (S.RETRY, {}, {"reason": ""}, None, errors.InvalidArguments, "REASON_REQUIRED"),
    (S.COMMITTED, {}, {"reason": " \n\t"}, {"a": 1}, errors.InvalidArguments, "REASON_REQUIRED"),
    (S.NOT_COMMITTED, {}, {"reason": "x" * 501}, None, errors.InvalidArguments, "REASON_TOO_LONG"),
    (S.COMMITTED, {}, {"reference": "a\nb"}, None, errors.InvalidArguments, "BAD_REFERENCE"),
    (S.COMMITTED, {}, {}, None, errors.InvalidArguments, "RESULT_REQUIRED"),
    (S.RETRY, {}, {}, {"a": 1}, errors.InvalidArguments, "RESULT_NOT_EXPECTED"),
    (S.RETRY, {"state": State.FAILED}, {}, None, errors.InvalidState, ""),
    (S.COMMITTED, {"state": State.VERIFYING}, {"reference": "x"}, None, errors.InvalidState, ""),
    (S.NOT_COMMITTED, {"state": State.SUCCEEDED}, {}, None, errors.InvalidState, ""),
    (S.RETRY, {}, {"rev": "6"}, None, errors.StaleRevision, ""),
    (S.COMMITTED, {}, {"rev": "6", "reference": "x"}, None, errors.StaleRevision, ""),
    (S.RETRY, {"op_retries": 2}, {}, None, errors.OperatorRetriesSpent, ""),
]


@pytest.mark.parametrize(("how", "changes", "said", "result", "error", "hint"), REFUSALS)
def test_refusals(
    how: operator.Settle,
    changes: dict[str, Any],
    said: dict[str, str],
    result: Any,
    error: type[Exception],
    hint: str,
) -> None:
    with pytest.raises(error) as caught:
        settle(how, view(**changes), result, **said)
    assert isinstance(caught.value, errors.RequestRefused)
    assert caught.value.details.get("code_hint", "") == hint


def test_the_revision_read_is_accepted_when_current() -> None:
    assert settle(S.NOT_COMMITTED, rev="7").to is State.FAILED


def test_an_outcome_is_one_of_three() -> None:
    assert operator.Settle.parse("not_committed") is S.NOT_COMMITTED
    with pytest.raises(errors.InvalidArguments):
        operator.Settle.parse("maybe")


def test_nothing_else_moves_an_escalated_operation() -> None:
    with pytest.raises(ValueError, match="only an operator's resolution"):
        Transition(ref="r", states=(State.ESCALATED,), to=State.QUEUED, by="scheduler")


def test_the_view_reads_the_operator_retries() -> None:
    v = operator.View.from_fields("r", {"state": "escalated", "op_retries": "2"})
    assert v.op_retries == 2 and "op_retries" in operator.FIELDS
