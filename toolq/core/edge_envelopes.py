"""The envelopes an edge writes itself, for a call it could not finish: a refused
request, a wait that ended before the operation settled, its own failure.

The MCP server (:mod:`toolq.edges.mcp_server.envelopes`) and the framework adapters
(:mod:`toolq.integrations.common`) answer with these. Each edge passes the name
of the tool its agents follow an operation with (``follow_tool``: the MCP
server's ``get_operation``, the adapters' ``toolq_get_operation``), which the
text tells the agent to use. Each is a consistent
:class:`~toolq.core.envelope.ToolError` built from fixed text; nothing from an
exception or an upstream reaches it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from toolq.core import errors
from toolq.core.envelope import (
    Category,
    CommitState,
    Directive,
    FieldError,
    NextAction,
    Retry,
    ToolError,
)
from toolq.core.record import OperationRecord
from toolq.core.states import State


def edge_error(
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
    *,
    follow_tool: str,
) -> ToolError:
    """What a refused request tells the agent; nothing was created by it."""
    if exc.envelope is not None:
        return exc.envelope
    if isinstance(exc, errors.InvalidArguments):
        fields = exc.field_errors or [FieldError(field="arguments", rule="invalid")]
        return edge_error(
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
        return edge_error(
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
        return edge_error(
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
        return edge_error(
            "INVALID_STATE",
            Category.CONFLICT,
            ref,
            tool,
            call_id,
            f"The operation is not in a state that allows this; read it again with {follow_tool}.",
            "That cannot be done at this point.",
            safe_details={"state": state} if isinstance(state, str) else {},
        )
    return edge_error(
        "REQUEST_REFUSED",
        Category.INTERNAL,
        ref,
        tool,
        call_id,
        "toolq refused this request; it needs an operator.",
        "Something is misconfigured; a person will look at it.",
        next_action=NextAction.ESCALATE,
    )


def may_be_queued(
    code: str,
    category: Category,
    ref: str,
    tool: str | None,
    call_id: str | None,
    follow_tool: str,
) -> ToolError:
    """A write the edge may have queued and cannot confirm: the agent follows the ref
    with ``follow_tool`` before anything else (``unknown``: toolq verifies it)."""
    return edge_error(
        code,
        category,
        ref,
        tool,
        call_id,
        f"The call may have been queued. Follow operation_ref with {follow_tool} "
        "before calling the tool again.",
        "I could not confirm whether this was queued; I am checking.",
        unknown=True,
        safe_details={"verification_tool": follow_tool},
    )


def unavailable_envelope(
    ref: str,
    tool: str | None,
    call_id: str | None,
    *,
    writes: bool,
    follow_tool: str,
    now: datetime,
    retry_after: float,
) -> ToolError:
    """toolq's server did not answer (:class:`errors.ServerUnavailable`). A write may
    have been queued before the answer was lost: follow the ref with ``follow_tool``
    before anything else. Anything else was not: try again after ``retry_after`` s."""
    if writes:
        return may_be_queued(
            "QUEUE_UNAVAILABLE", Category.DEPENDENCY, ref, tool, call_id, follow_tool
        )
    return edge_error(
        "QUEUE_UNAVAILABLE",
        Category.DEPENDENCY,
        ref,
        tool,
        call_id,
        "The tool queue is unavailable; try again after retry_after seconds.",
        "This is unavailable right now; I will try again shortly.",
        retry=Retry(
            directive=Directive.AFTER_DELAY,
            not_before=now + timedelta(seconds=retry_after),
            max_attempts_remaining=1,
        ),
        next_action=NextAction.WAIT_AND_RETRY,
        safe_details={"retry_after": retry_after},
    )


def unexpected_envelope(
    ref: str,
    tool: str | None,
    call_id: str | None,
    *,
    may_have_submitted: bool,
    follow_tool: str,
    dependency: bool = False,
) -> ToolError:
    """A failure in the edge itself. A write it may have submitted may be running:
    ``OUTCOME_UNKNOWN``, a ``dependency`` failure when the edge lost its server
    (else internal); anything else escalates."""
    if may_have_submitted:
        category = Category.DEPENDENCY if dependency else Category.INTERNAL
        return may_be_queued("OUTCOME_UNKNOWN", category, ref, tool, call_id, follow_tool)
    return edge_error(
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
    record: OperationRecord, *, writes: bool, poll: float, now: datetime, follow_tool: str
) -> ToolError:
    """``OPERATION_PENDING`` for an operation the wait left unsettled.

    ``unknown`` (verify_operation) while a write's attempt may have started
    (running, verifying): toolq finishes or verifies it. Else ``not_committed``
    with ``after_delay``: follow it again after ``poll`` seconds, or after the
    retry a waiting operation stands for, whichever is later.
    """
    ref, state, tool = record.operation_ref, record.state, record.tool or None
    call_id, details = record.call_id, {"state": str(state)}
    if writes and state in (State.RUNNING, State.VERIFYING):
        return edge_error(
            "OPERATION_PENDING",
            Category.DEPENDENCY,
            ref,
            tool,
            call_id,
            "The operation is still in progress and may have taken effect. Follow "
            f"operation_ref with {follow_tool}; do not call the tool again.",
            "This is still in progress.",
            unknown=True,
            safe_details={**details, "verification_tool": follow_tool},
        )
    not_before = now + timedelta(seconds=poll)
    stored = record.envelope
    if state is State.WAITING_RETRY and isinstance(stored, ToolError) and stored.retry.not_before:
        not_before = max(not_before, stored.retry.not_before)
    left = record.max_attempts - record.attempt
    return edge_error(
        "OPERATION_PENDING",
        Category.DEPENDENCY,
        ref,
        tool,
        call_id,
        "The operation has not taken effect yet. After retry_after seconds, follow "
        f"operation_ref with {follow_tool}; do not call the tool again.",
        "This is queued and will run shortly.",
        retry=Retry(
            directive=Directive.AFTER_DELAY,
            not_before=not_before,
            max_attempts_remaining=max(1, left),
        ),
        next_action=NextAction.WAIT_AND_RETRY,
        safe_details={**details, "retry_after": round((not_before - now).total_seconds(), 3)},
    )
