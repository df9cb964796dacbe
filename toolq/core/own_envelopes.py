"""The envelopes toolq writes itself: successes, unknown outcomes, escalations,
cancellations. Every one is built from fixed text; nothing upstream reaches it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from toolq.core import errors
from toolq.core.envelope import (
    Category,
    CommitState,
    Directive,
    NextAction,
    Retry,
    ToolError,
    ToolSuccess,
    Verification,
)
from toolq.core.record import ms_to_dt
from toolq.core.tools import jsonable

_C, _S, _A = Category, CommitState, NextAction
_UNKNOWN_AGENT = "The write may have completed. Verify operation_ref before any new write."
_UNKNOWN_USER = "The request is being checked before anything is sent again."

#: code -> (category, commit_state, next_action, agent_message, user_message)
FIXED: dict[str, tuple[Category, CommitState, NextAction, str, str]] = {
    "OUTCOME_UNKNOWN": (
        _C.DEPENDENCY,
        _S.UNKNOWN,
        _A.VERIFY_OPERATION,
        _UNKNOWN_AGENT,
        _UNKNOWN_USER,
    ),
    # An unknown outcome nothing will settle: escalated, and the envelope says so.
    "VERIFICATION_UNAVAILABLE": (
        _C.DEPENDENCY,
        _S.UNKNOWN,
        _A.ESCALATE,
        "The outcome is unknown and could not be verified; "
        "an operator must check before anything is sent again.",
        "I could not confirm whether this went through; a person will check.",
    ),
    "OUTCOME_UNVERIFIABLE": (
        _C.DEPENDENCY,
        _S.UNKNOWN,
        _A.ESCALATE,
        "The write may have completed and this tool has no verifier; "
        "an operator must check before anything is sent again.",
        "I could not confirm whether this went through; a person will check.",
    ),
    "ATTEMPTS_EXHAUSTED": (
        _C.DEPENDENCY,
        _S.NOT_COMMITTED,
        _A.ESCALATE,
        "Every allowed attempt was used without success; this needs an operator.",
        "This could not be completed; a person will look at it.",
    ),
    "DEADLINE_EXCEEDED": (
        _C.DEPENDENCY,
        _S.NOT_COMMITTED,
        _A.ESCALATE,
        "The operation's deadline passed before it could complete; this needs an operator.",
        "This took too long to complete; a person will look at it.",
    ),
    "RETRY_BEYOND_DEADLINE": (
        _C.DEPENDENCY,
        _S.NOT_COMMITTED,
        _A.ESCALATE,
        "The next retry would fall after the operation's deadline; this needs an operator.",
        "This cannot be retried in time; a person will look at it.",
    ),
    "APPROVAL_TIMEOUT": (
        _C.AUTHORIZATION,
        _S.NOT_COMMITTED,
        _A.ESCALATE,
        "No approval arrived in time; this needs an operator.",
        "This was not approved in time; a person will look at it.",
    ),
    "INPUT_TIMEOUT": (
        _C.VALIDATION,
        _S.NOT_COMMITTED,
        _A.ESCALATE,
        "No corrected input arrived in time; this needs an operator.",
        "No corrected details arrived in time; a person will look at it.",
    ),
    "OPERATION_CANCELLED": (
        _C.CONFLICT,
        _S.NOT_COMMITTED,
        _A.REREAD_STATE,
        "The operation was cancelled before it ran; nothing was sent.",
        "This was cancelled.",
    ),
    # An escalated write an operator checked at the provider and found not written.
    "RESOLVED_NOT_COMMITTED": (
        _C.DEPENDENCY,
        _S.NOT_COMMITTED,
        _A.REREAD_STATE,
        "An operator confirmed that the write did not happen; nothing will be sent "
        "for this operation_ref.",
        "This was not done; a person checked and nothing was sent.",
    ),
    "IDEMPOTENCY_KEY_REUSED": (
        _C.CONFLICT,
        _S.NOT_COMMITTED,
        _A.REREAD_STATE,
        "This operation_ref was already used with other arguments; "
        "read that operation or use a new ref.",
        "This request conflicts with an earlier one.",
    ),
}


def fixed_envelope(
    code: str, ref: str, tool: str, call_id: str | None, details: dict[str, Any] | None = None
) -> ToolError:
    """An envelope for one of toolq's own conditions, by the FIXED table."""
    category, commit, action, agent, user = FIXED[code]
    return ToolError(
        code=code,
        category=category,
        commit_state=commit,
        retry=Retry(directive=Directive.NEVER, max_attempts_remaining=0),
        next_action=action,
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        safe_details=details or {},
        agent_message=agent,
        user_message=user,
    )


def success_envelope(
    ref: str,
    tool: str,
    call_id: str | None,
    result: Any,
    now: datetime,
    evidence_ref: str | None = None,
    max_bytes: int | None = None,
) -> ToolSuccess:
    """``ValueError`` for a result JSON cannot hold, :class:`ResultTooLarge` for one
    longer than ``max_bytes`` (``limits.max_result_bytes``)."""
    return ToolSuccess(
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        result=jsonable(result, max_bytes),
        verification=Verification(checked_at=now, evidence_ref=evidence_ref),
    )


#: How an operator-confirmed success names its evidence: ``operator:<who>``.
OPERATOR_EVIDENCE = "operator:"


def operator_confirmed_envelope(
    ref: str, tool: str, call_id: str | None, result: Any, now: datetime, by: str
) -> ToolSuccess:
    """A write an operator confirmed at the provider: ``verification.evidence_ref`` is
    ``operator:<who>`` (a verifier's is ``verification:<tool>``), so the agent can tell."""
    evidence = (OPERATOR_EVIDENCE + by)[:200]
    return success_envelope(ref, tool, call_id, result, now, evidence_ref=evidence)


def resolved_not_committed_envelope(ref: str, tool: str, call_id: str | None) -> ToolError:
    return fixed_envelope("RESOLVED_NOT_COMMITTED", ref, tool, call_id)


def unknown_envelope(
    ref: str, tool: str, call_id: str | None, verification_tool: str | None
) -> ToolError:
    """The write may have happened: what the agent sees while toolq verifies it."""
    details = {"verification_tool": verification_tool} if verification_tool else {}
    return fixed_envelope("OUTCOME_UNKNOWN", ref, tool, call_id, details)


def unverifiable_envelope(
    ref: str, tool: str, call_id: str | None, reason: str | None = None
) -> ToolError:
    """The write may have happened and nothing will verify it: a person must check.

    ``reason`` is the code of what made the outcome unknown (a toolq or tool
    code, never upstream text).
    """
    return fixed_envelope("OUTCOME_UNVERIFIABLE", ref, tool, call_id, {"reason": reason})


def escalation_envelope(code: str, ref: str, tool: str, call_id: str | None) -> ToolError:
    return fixed_envelope(code, ref, tool, call_id)


def cancelled_envelope(ref: str, tool: str, call_id: str | None) -> ToolError:
    return fixed_envelope("OPERATION_CANCELLED", ref, tool, call_id)


def needs_approval_envelope(ref: str, tool: str, call_id: str | None) -> ToolError:
    return errors.error_envelope(
        errors.NeedsApproval(),
        writes=True,
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        attempts_remaining=0,
        now=ms_to_dt(0),
    )


#: A call its dependency key holds back (issue 28): the agent's and the user's words.
DEPENDENCY_LIMITED = "DEPENDENCY_LIMITED"
DEPENDENCY_LIMITED_AGENT = (
    "The provider this call needs is limited or paused; toolq will run the call after "
    "retry.not_before without spending an attempt. Do not call the tool again."
)
DEPENDENCY_LIMITED_USER = "This is waiting for the service it needs; it will run shortly."


def dependency_limited_envelope(
    ref: str,
    tool: str,
    call_id: str | None,
    key: str,
    reason: str,
    not_before_ms: int,
    attempts_remaining: int,
) -> ToolError:
    """What the agent reads of a call its dependency key holds back (``waiting_retry``);
    the claim script writes the same (the contract test compares them)."""
    return ToolError(
        code=DEPENDENCY_LIMITED,
        category=Category.DEPENDENCY,
        commit_state=CommitState.NOT_COMMITTED,
        retry=Retry(
            directive=Directive.AFTER_DELAY,
            not_before=ms_to_dt(not_before_ms),
            max_attempts_remaining=max(1, attempts_remaining),
        ),
        next_action=NextAction.WAIT_AND_RETRY,
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        safe_details={"dependency": key, "reason": reason},
        agent_message=DEPENDENCY_LIMITED_AGENT,
        user_message=DEPENDENCY_LIMITED_USER,
    )
