"""What the model sees (pure): the kind of an envelope (what the framework does
with it), its text, the follow tool, and the envelopes an adapter writes itself
(from :mod:`toolq.core.edge_envelopes`, as the MCP server's are, naming :data:`FOLLOW_TOOL`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from toolq.core import edge_envelopes, errors
from toolq.core.envelope import (
    AnyEnvelope,
    NextAction,
    ToolError,
    ToolSuccess,
)
from toolq.core.record import OperationRecord
from toolq.core.render import to_text
from toolq.core.settings import LimitSettings

#: What a PENDING answer for a queued or delayed operation tells the model to wait.
POLL_S = 1.0
#: The built-in tool an adapter adds for following a pending operation by its ref.
FOLLOW_TOOL = "toolq_get_operation"
FOLLOW_DESCRIPTION = (
    "Read a toolq operation by operation_ref (from an earlier tool result that was "
    "still pending), waiting a while for it to finish; returns its result or envelope. "
    "Use it instead of calling the original tool again."
)

_AFTER_APPROVAL = (
    f"Once a person approves it, follow operation_ref with {FOLLOW_TOOL}; "
    "do not call the tool again."
)

# --------------------------------------------------------------------------- kinds


class Kind(StrEnum):
    """What a framework does with an envelope (:func:`kind_of`)."""

    #: Committed: the result goes to the model.
    RESULT = "result"
    #: The model must correct the named fields: the framework's retry signal.
    FIX_INPUT = "fix_input"
    #: A person must approve first: the framework's pause, then resolve_approval().
    APPROVAL = "approval"
    #: Not finished: toolq retries, verifies or runs it; the model follows the ref
    #: and never calls the tool again (the framework never retries it either).
    PENDING = "pending"
    #: Terminal: escalated, conflict, refused, cancelled, exhausted.
    FAILED = "failed"


#: next_action -> kind, for error envelopes.
KINDS: dict[NextAction, Kind] = {
    NextAction.CORRECT_INPUT: Kind.FIX_INPUT,
    NextAction.REQUEST_APPROVAL: Kind.APPROVAL,
    # An unknown outcome toolq is verifying (commit_state unknown).
    NextAction.VERIFY_OPERATION: Kind.PENDING,
    # toolq's scheduler retries it at not_before; the model must not.
    NextAction.WAIT_AND_RETRY: Kind.PENDING,
    # An unknown outcome nothing will verify is escalated too: terminal for the agent.
    NextAction.ESCALATE: Kind.FAILED,
    NextAction.REREAD_STATE: Kind.FAILED,
    NextAction.CHOOSE_ALLOWED_OPERATION: Kind.FAILED,
}


def kind_of(envelope: AnyEnvelope) -> Kind:
    """The kind of an envelope (pure; :data:`KINDS`)."""
    if isinstance(envelope, ToolSuccess):
        return Kind.RESULT
    return KINDS[envelope.next_action]


# --------------------------------------------------------------------------- the model's text


def model_text(envelope: AnyEnvelope) -> str:
    """What the model reads: one line (``agent_message``; for FIX_INPUT the fields to
    fix, for APPROVAL how to follow it), then the envelope's compact JSON, as
    :func:`toolq.core.render.to_text` writes them. Fixed text only: nothing here can carry
    a secret."""
    if isinstance(envelope, ToolSuccess):
        return to_text(envelope)
    line = envelope.agent_message
    if kind_of(envelope) is Kind.APPROVAL:
        line = f"{line} {_AFTER_APPROVAL}"
    if envelope.field_errors:
        fields = ", ".join(f"{fe.field} ({fe.rule})" for fe in envelope.field_errors)
        line = f"{line} Fields to fix: {fields}."
    return to_text(envelope, line)


def output_text(envelope: AnyEnvelope) -> str:
    """A tool's output as text for the model: a committed call's result as compact
    JSON, anything else as :func:`model_text`."""
    if isinstance(envelope, ToolSuccess):
        result = envelope.model_dump(mode="json", include={"result"})["result"]
        return json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    return model_text(envelope)


def field_names(envelope: AnyEnvelope) -> list[str]:
    """The fields a FIX_INPUT envelope names (``field_errors``, else ``safe_details.field``)."""
    if isinstance(envelope, ToolSuccess):
        return []
    if envelope.field_errors:
        return [fe.field for fe in envelope.field_errors]
    field = envelope.safe_details.get("field")
    return [field] if isinstance(field, str) else []


def follow_schema(limits: LimitSettings | None = None) -> dict[str, Any]:
    """The JSON Schema of :data:`FOLLOW_TOOL`'s arguments (strict-mode compatible)."""
    limits = limits or LimitSettings()
    ref = {
        "type": "string",
        "description": "The operation_ref of the pending operation.",
        "maxLength": limits.max_ref_length,
        "pattern": limits.ref_pattern,
    }
    return {
        "type": "object",
        "properties": {"operation_ref": ref},
        "required": ["operation_ref"],
        "additionalProperties": False,
    }


# --------------------------------------------------------------------------- envelopes
#
# From toolq.core.edge_envelopes, which the MCP edge shares, naming FOLLOW_TOOL.


def pending_envelope(record: OperationRecord, *, writes: bool, now: datetime) -> ToolError:
    """OPERATION_PENDING for an operation the wait left unsettled (kind PENDING);
    one not running is followed again after :data:`POLL_S` seconds."""
    return edge_envelopes.pending_envelope(
        record, writes=writes, poll=POLL_S, now=now, follow_tool=FOLLOW_TOOL
    )


def refused_envelope(
    exc: errors.RequestRefused,
    ref: str,
    tool: str | None,
    call_id: str | None,
    max_attempts: int = 1,
) -> ToolError:
    """What a refused request tells the model; nothing was created by it."""
    return edge_envelopes.refused_envelope(
        exc, ref, tool, call_id, max_attempts, follow_tool=FOLLOW_TOOL
    )


def unexpected_envelope(
    ref: str, tool: str | None, call_id: str | None, *, may_have_submitted: bool
) -> ToolError:
    """A failure in the adapter itself: a submitted write may be running (PENDING)."""
    return edge_envelopes.unexpected_envelope(
        ref, tool, call_id, may_have_submitted=may_have_submitted, follow_tool=FOLLOW_TOOL
    )


def unavailable_envelope(
    ref: str, tool: str | None, call_id: str | None, *, writes: bool
) -> ToolError:
    """toolq's server did not answer. A write may have been queued: follow the ref
    before anything else (kind PENDING); a read was not: try later (PENDING too)."""
    return edge_envelopes.unavailable_envelope(
        ref,
        tool,
        call_id,
        writes=writes,
        follow_tool=FOLLOW_TOOL,
        now=datetime.now(UTC),
        retry_after=5 * POLL_S,
    )
