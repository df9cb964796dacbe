"""The envelopes toolq writes itself: successes, unknown outcomes, escalations,
cancellations. Every one is built from fixed text; nothing upstream reaches it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from toolq import errors
from toolq.envelope import (
    Category,
    CommitState,
    Directive,
    NextAction,
    Retry,
    ToolError,
    ToolSuccess,
    Verification,
)
from toolq.ledger.record import ms_to_dt
from toolq.tasks.registry import jsonable

_ESCALATIONS: dict[str, tuple[Category, str, str]] = {
    "ATTEMPTS_EXHAUSTED": (
        Category.DEPENDENCY,
        "Every allowed attempt was used without success; this needs an operator.",
        "This could not be completed; a person will look at it.",
    ),
    "DEADLINE_EXCEEDED": (
        Category.DEPENDENCY,
        "The operation's deadline passed before it could complete; this needs an operator.",
        "This took too long to complete; a person will look at it.",
    ),
    "RETRY_BEYOND_DEADLINE": (
        Category.DEPENDENCY,
        "The next retry would fall after the operation's deadline; this needs an operator.",
        "This cannot be retried in time; a person will look at it.",
    ),
    "APPROVAL_TIMEOUT": (
        Category.AUTHORIZATION,
        "No approval arrived in time; this needs an operator.",
        "This was not approved in time.",
    ),
    "INPUT_TIMEOUT": (
        Category.VALIDATION,
        "No corrected input arrived in time; this needs an operator.",
        "No corrected details arrived in time.",
    ),
}


def success_envelope(
    ref: str,
    tool: str,
    call_id: str | None,
    result: Any,
    now: datetime,
    evidence_ref: str | None = None,
) -> ToolSuccess:
    return ToolSuccess(
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        result=jsonable(result),
        verification=Verification(checked_at=now, evidence_ref=evidence_ref),
    )


def unknown_envelope(
    ref: str,
    tool: str,
    call_id: str | None,
    verification_tool: str | None,
    code: str = "OUTCOME_UNKNOWN",
) -> ToolError:
    details = {"verification_tool": verification_tool} if verification_tool else {}
    return ToolError(
        code=code,
        category=Category.DEPENDENCY,
        commit_state=CommitState.UNKNOWN,
        retry=Retry(directive=Directive.NEVER, max_attempts_remaining=0),
        next_action=NextAction.VERIFY_OPERATION,
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        safe_details=details,
        agent_message="The write may have completed. Verify operation_ref before any new write.",
        user_message="The request is being checked before anything is sent again.",
    )


def escalation_envelope(code: str, ref: str, tool: str, call_id: str | None) -> ToolError:
    if code == "VERIFICATION_UNAVAILABLE":
        env = unknown_envelope(ref, tool, call_id, None, code=code)
        return env.model_copy(
            update={
                "agent_message": "The outcome is unknown and could not be verified; "
                "an operator must check before anything is sent again.",
                "user_message": "I could not confirm whether this went through; "
                "a person will check.",
            }
        )
    category, agent, user = _ESCALATIONS[code]
    return ToolError(
        code=code,
        category=category,
        commit_state=CommitState.NOT_COMMITTED,
        retry=Retry(directive=Directive.NEVER, max_attempts_remaining=0),
        next_action=NextAction.ESCALATE,
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        agent_message=agent,
        user_message=user,
    )


def cancelled_envelope(ref: str, tool: str, call_id: str | None) -> ToolError:
    return ToolError(
        code="OPERATION_CANCELLED",
        category=Category.CONFLICT,
        commit_state=CommitState.NOT_COMMITTED,
        retry=Retry(directive=Directive.NEVER, max_attempts_remaining=0),
        next_action=NextAction.REREAD_STATE,
        operation_ref=ref,
        operation=tool,
        call_id=call_id or None,
        agent_message="The operation was cancelled before it ran; nothing was sent.",
        user_message="This was cancelled.",
    )


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
