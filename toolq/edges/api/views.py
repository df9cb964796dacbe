"""What the API says about an operation: one view, for the JSON routes and the event stream."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from toolq.adapters.ledger.dep_state import DepDetail
from toolq.core import own_envelopes as fixed
from toolq.core import why
from toolq.core.envelope import ToolError, ToolSuccess, to_dict
from toolq.core.record import OperationRecord
from toolq.core.states import SETTLED, State
from toolq.decisions.dep_actions import MAX_REASON


class OperationView(BaseModel):
    operation_ref: str
    tool: str
    state: State
    attempt: int
    max_attempts: int
    #: Nothing more is needed from the runtime (finished, or waiting on a person).
    settled: bool
    #: On invoke: whether this request created the operation.
    created: bool | None = None
    #: The latest envelope; a failed tool's envelope is here, with a 200.
    envelope: dict[str, Any] | None = None
    #: While not settled: seconds to wait before polling again (also ``Retry-After``).
    poll_interval: float | None = None
    created_at: datetime
    updated_at: datetime
    #: The record's revision: ``:resolve`` may name the one it was decided on.
    rev: int = 0
    #: Why it waits (:func:`toolq.core.why.explain`), each only where it applies: its
    #: verification checks and the next one, its last failure and budget while it
    #: waits to retry, its escalation's reason in words and what was tried.
    verification: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    escalation: dict[str, Any] | None = None


class ResolveRequest(BaseModel):
    """How an operator settles an escalated operation (``:resolve``)."""

    model_config = ConfigDict(extra="forbid")

    #: committed: succeeded, with ``result`` or ``reference``; not_committed: failed;
    #: retry: one attempt more under the same operation_ref.
    outcome: Literal["committed", "not_committed", "retry"]
    #: What was checked (kept in the history with who acted).
    reason: str = Field(min_length=1, max_length=500)
    #: The write's result, for committed.
    result: Any = None
    #: Where it was seen: the provider's id, a ticket.
    reference: str = Field(default="", max_length=200)
    #: The revision read (the view's ``rev``): refused with 409 if it moved on since.
    rev: int | None = Field(default=None, ge=0)


class DepActionRequest(BaseModel):
    """Why an operator lifts a key's pause or closes its breaker (``/v1/deps/{key}:lift``,
    ``:close``)."""

    model_config = ConfigDict(extra="forbid")

    #: Kept on the key with who acted and when.
    reason: str = Field(min_length=1, max_length=MAX_REASON)


class DepList(BaseModel):
    """Every dependency key the ledger has limited."""

    deps: list[DepDetail]


def view_body(
    rec: OperationRecord,
    poll: float,
    created: bool | None = None,
    envelope: ToolSuccess | ToolError | None = None,
) -> dict[str, Any]:
    """The :class:`OperationView` of ``rec`` as JSON; ``envelope`` overrides the record's."""
    settled = rec.state in SETTLED
    env = envelope if envelope is not None else rec.envelope
    body = OperationView(
        operation_ref=rec.operation_ref,
        tool=rec.tool,
        state=rec.state,
        attempt=rec.attempt,
        max_attempts=rec.max_attempts,
        settled=settled,
        created=created,
        envelope=to_dict(env) if env is not None else None,
        poll_interval=None if settled else poll,
        created_at=rec.created_at,
        updated_at=rec.updated_at,
        rev=rec.rev,
        **why.explain(rec, int(datetime.now(UTC).timestamp() * 1000)),
    )
    return body.model_dump(mode="json", exclude_none=True)


def settled_envelope(rec: OperationRecord) -> ToolSuccess | ToolError | None:
    """The envelope ``tq.wait`` returns for a settled record.

    An operation awaiting approval before its first attempt has stored none yet.
    """
    if rec.envelope is None and rec.state is State.AWAITING_APPROVAL:
        return fixed.needs_approval_envelope(rec.operation_ref, rec.tool, rec.call_id)
    return rec.envelope


def view_response(
    rec: OperationRecord, status: int, poll: float, created: bool | None
) -> JSONResponse:
    headers: dict[str, str] = {}
    if status == 202:
        headers["Location"] = "/v1/operations/" + quote(rec.operation_ref, safe="/:@+=")
    if rec.state not in SETTLED:
        headers["Retry-After"] = str(retry_after(rec, poll))
    return JSONResponse(view_body(rec, poll, created), status_code=status, headers=headers)


def retry_after(rec: OperationRecord, poll: float) -> int:
    env = rec.envelope
    if rec.state is State.WAITING_RETRY and isinstance(env, ToolError) and env.retry.not_before:
        return max(1, math.ceil((env.retry.not_before - datetime.now(UTC)).total_seconds()))
    return max(1, math.ceil(poll))


def tool_view(t: Any) -> dict[str, Any]:
    return {
        "name": t.name,
        "description": t.options.description,
        "writes": t.writes,
        "idempotent": t.options.idempotent,
        "requires_approval": t.options.requires_approval,
        "verification_tool": t.verification_tool,
        "input_schema": t.input_schema(),
    }
