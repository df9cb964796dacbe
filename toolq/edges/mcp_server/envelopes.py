"""The envelopes the MCP adapter writes itself: refusals, its own failures, pending waits.

Built by :mod:`toolq.core.edge_envelopes`, which the framework adapters share, with
:data:`GET_OPERATION` as the tool that follows an operation; a Redis error makes
an unknown outcome a dependency failure. Only ``FORBIDDEN_SCOPE`` is the MCP
server's own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import redis
from pydantic import BaseModel, Field, create_model

from toolq.core import edge_envelopes, errors
from toolq.core.envelope import Category, NextAction, ToolError
from toolq.core.record import OperationRecord
from toolq.core.settings import LimitSettings

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


def refused_envelope(
    exc: errors.RequestRefused,
    ref: str,
    tool: str | None,
    call_id: str | None,
    max_attempts: int = 1,
) -> ToolError:
    """What a refused request tells the agent; nothing was created by it."""
    return edge_envelopes.refused_envelope(
        exc, ref, tool, call_id, max_attempts, follow_tool=GET_OPERATION
    )


def unavailable_envelope(
    ref: str, tool: str | None, call_id: str | None, *, writes: bool, now: datetime, poll: float
) -> ToolError:
    """The queue's server did not answer: a write may have been queued (follow the ref
    with get_operation first); anything else: try again after 5 polls."""
    return edge_envelopes.unavailable_envelope(
        ref,
        tool,
        call_id,
        writes=writes,
        follow_tool=GET_OPERATION,
        now=now,
        retry_after=max(1.0, 5 * poll),
    )


def forbidden_envelope(ref: str, call_id: str | None, scope: str) -> ToolError:
    return edge_envelopes.edge_error(
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
    """An unexpected failure in the adapter: a submitted write may be running (a
    dependency failure when Redis failed it)."""
    return edge_envelopes.unexpected_envelope(
        ref,
        tool,
        call_id,
        may_have_submitted=may_have_submitted,
        follow_tool=GET_OPERATION,
        dependency=isinstance(exc, redis.RedisError),
    )


def pending_envelope(
    record: OperationRecord, *, writes: bool, poll: float, now: datetime
) -> ToolError:
    """The envelope for an operation the wait left unsettled; see the package docstring."""
    return edge_envelopes.pending_envelope(
        record, writes=writes, poll=poll, now=now, follow_tool=GET_OPERATION
    )
