"""The envelopes the MCP adapter writes itself: refusals, its own failures, pending waits.

Each is a consistent :class:`~toolq.envelope.ToolError` built from fixed text;
nothing from an exception or an upstream reaches it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import redis
from pydantic import BaseModel, Field, create_model

from toolq import errors
from toolq.envelope import (
    Category,
    CommitState,
    Directive,
    FieldError,
    NextAction,
    Retry,
    ToolError,
)
from toolq.record import OperationRecord
from toolq.settings import LimitSettings
from toolq.states import State

GET_OPERATION = "get_operation"
CANCEL_OPERATION = "cancel_operation"


class FollowArgs(BaseModel):
    #: Bounded by the deployment's ref limit in the model :func:`builtin_args` makes.
    operation_ref: str
    wait_seconds: float | None = Field(default=None, ge=0, le=300)


class CancelArgs(BaseModel):
    operation_ref: str


def builtin_args(limits: LimitSettings) -> tuple[type[FollowArgs], type[CancelArgs]]:
    """The built-in tools' argument models, their ref bounded by ``limits.max_ref_length``."""
    ref: Any = (str, Field(max_length=limits.max_ref_length, pattern=limits.ref_pattern))
    return (
        create_model("FollowArgs", __base__=FollowArgs, operation_ref=ref),
        create_model("CancelArgs", __base__=CancelArgs, operation_ref=ref),
    )


def _error(
    code: str,
    category: Category,
    ref: str,
    tool: str | None,
    call_id: str | None,
    agent: str,
    user: str,
    *,
    unknown: bool = False,
    **extra: Any,
) -> ToolError:
    """An envelope toolq writes itself; ``unknown`` ones are verified, others never repeat."""
    data: dict[str, Any] = {
        "code": code,
        "category": category,
        "operation_ref": ref,
        "operation": tool,
        "call_id": call_id,
        "agent_message": agent,
        "user_message": user,
        "commit_state": CommitState.UNKNOWN if unknown else CommitState.NOT_COMMITTED,
        "retry": Retry(directive=Directive.NEVER, max_attempts_remaining=0),
        "next_action": NextAction.VERIFY_OPERATION if unknown else NextAction.REREAD_STATE,
    }
    data.update(extra)
    return ToolError.model_validate(data)


def refused_envelope(
    exc: errors.RequestRefused,
    ref: str,
    tool: str | None,
    call_id: str | None,
    max_attempts: int = 1,
) -> ToolError:
    """What a refused request tells the agent; nothing was created by it."""
    if exc.envelope is not None:
        return exc.envelope
    if isinstance(exc, errors.InvalidArguments):
        fields = exc.field_errors or [FieldError(field="arguments", rule="invalid")]
        return _error(
            "INVALID_ARGUMENTS",
            Category.VALIDATION,
            ref,
            tool,
            call_id,
            "The arguments do not validate; correct the listed fields and call again.",
            "I need corrected details before I can do this.",
            retry=Retry(
                directive=Directive.AFTER_INPUT_FIX, max_attempts_remaining=max(1, max_attempts)
            ),
            next_action=NextAction.CORRECT_INPUT,
            field_errors=fields[:20],
        )
    if isinstance(exc, errors.UnknownTool):
        return _error(
            "UNKNOWN_TOOL",
            Category.VALIDATION,
            ref,
            None,
            call_id,
            "There is no tool by this name; choose one from the tool list.",
            "I cannot do that here.",
            next_action=NextAction.CHOOSE_ALLOWED_OPERATION,
        )
    if isinstance(exc, errors.OperationNotFound):
        return _error(
            "OPERATION_NOT_FOUND",
            Category.CONFLICT,
            ref,
            tool,
            call_id,
            "No operation has this operation_ref (or it has expired).",
            "I could not find that request.",
        )
    if isinstance(exc, errors.InvalidState):
        state = exc.details.get("state")
        return _error(
            "INVALID_STATE",
            Category.CONFLICT,
            ref,
            tool,
            call_id,
            "The operation is not in a state that allows this; read it again with get_operation.",
            "That cannot be done at this point.",
            safe_details={"state": state} if isinstance(state, str) else {},
        )
    return _error(
        "REQUEST_REFUSED",
        Category.INTERNAL,
        ref,
        tool,
        call_id,
        "toolq refused this request; it needs an operator.",
        "Something is misconfigured; a person will look at it.",
        next_action=NextAction.ESCALATE,
    )


def forbidden_envelope(ref: str, call_id: str | None, scope: str) -> ToolError:
    return _error(
        "FORBIDDEN_SCOPE",
        Category.AUTHORIZATION,
        ref,
        None,
        call_id,
        "This token may not do that; choose an allowed operation.",
        "I am not allowed to do that.",
        next_action=NextAction.CHOOSE_ALLOWED_OPERATION,
        safe_details={"reason": scope},
    )


def unexpected_envelope(
    exc: BaseException, ref: str, tool: str | None, call_id: str | None, *, may_have_submitted: bool
) -> ToolError:
    """An unexpected failure in the adapter: a submitted write may be running."""
    if may_have_submitted:
        return _error(
            "OUTCOME_UNKNOWN",
            Category.DEPENDENCY if isinstance(exc, redis.RedisError) else Category.INTERNAL,
            ref,
            tool,
            call_id,
            "The call may have been queued. Follow operation_ref with get_operation "
            "before calling the tool again.",
            "I could not confirm whether this was queued; I am checking.",
            unknown=True,
            safe_details={"verification_tool": GET_OPERATION},
        )
    return _error(
        "INTERNAL_ERROR",
        Category.INTERNAL,
        ref,
        tool,
        call_id,
        "toolq failed to serve this request; it needs an operator.",
        "Something went wrong; a person will look at it.",
        next_action=NextAction.ESCALATE,
    )


def pending_envelope(
    record: OperationRecord, *, writes: bool, poll: float, now: datetime
) -> ToolError:
    """The envelope for an operation the wait left unsettled; see the package docstring."""
    ref, state, tool = record.operation_ref, record.state, record.tool or None
    call_id, details = record.call_id, {"state": str(state)}
    if writes and state in (State.RUNNING, State.VERIFYING):
        return _error(
            "OPERATION_PENDING",
            Category.DEPENDENCY,
            ref,
            tool,
            call_id,
            "The operation is still in progress and may have taken effect. Follow "
            "operation_ref with get_operation; do not call the tool again.",
            "This is still in progress.",
            unknown=True,
            safe_details={**details, "verification_tool": GET_OPERATION},
        )
    not_before = now + timedelta(seconds=poll)
    stored = record.envelope
    if state is State.WAITING_RETRY and isinstance(stored, ToolError) and stored.retry.not_before:
        not_before = max(not_before, stored.retry.not_before)
    left = record.max_attempts - record.attempt
    return _error(
        "OPERATION_PENDING",
        Category.DEPENDENCY,
        ref,
        tool,
        call_id,
        "The operation has not taken effect yet. After retry_after seconds, follow "
        "operation_ref with get_operation; do not call the tool again.",
        "This is queued and will run shortly.",
        retry=Retry(
            directive=Directive.AFTER_DELAY,
            not_before=not_before,
            max_attempts_remaining=max(1, left),
        ),
        next_action=NextAction.WAIT_AND_RETRY,
        safe_details={**details, "retry_after": round((not_before - now).total_seconds(), 3)},
    )
