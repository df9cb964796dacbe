"""An envelope in the shape each ecosystem expects: plain dicts, no SDK imports.

- :func:`to_mcp_result`: an MCP ``CallToolResult`` (``isError``,
  ``structuredContent`` = the whole envelope, and a text block for clients
  that read only text: the one-line message, then the compact JSON).
- :func:`to_openai_output`: an OpenAI Responses ``function_call_output`` item;
  it has no error flag, the envelope's ``ok`` says it.
- :func:`to_anthropic_tool_result`: an Anthropic ``tool_result`` block with
  ``is_error``.
- :func:`to_text`: the text the MCP and Anthropic results carry (the
  one-line message, then the compact JSON), for any edge that shows text.
- :func:`to_receipt`: the "failure receipt" of the seed article, derived from
  the envelope by :data:`RECEIPT_TABLE`.

Every renderer reads only the envelope, which the model already redacted, so
nothing here can add upstream text or secrets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from toolq.core.envelope import (
    AnyEnvelope,
    Category,
    CommitState,
    Directive,
    NextAction,
    ToolError,
    ToolSuccess,
    to_dict,
    to_json,
    utc,
)

SUCCESS_LINE = "The operation committed."

ErrorCode = Literal[
    "invalid_input",
    "needs_approval",
    "not_found",
    "conflict",
    "rate_limited",
    "timeout",
    "unavailable",
    "forbidden_scope",
]
SafeAction = Literal[
    "repair_input",
    "request_approval",
    "reread_state",
    "retry_once",
    "choose_allowed_operation",
    "stop_and_escalate",
]


def to_text(envelope: AnyEnvelope, line: str | None = None) -> str:
    """The text an agent reads: one line (``agent_message``, or :data:`SUCCESS_LINE`;
    ``line`` instead when given), then the envelope's compact JSON."""
    if line is None:
        line = envelope.agent_message if isinstance(envelope, ToolError) else SUCCESS_LINE
    return f"{line}\n{to_json(envelope)}"


def to_mcp_result(envelope: AnyEnvelope) -> dict[str, Any]:
    """An MCP ``CallToolResult`` as a dict (camelCase, as on the wire)."""
    return {
        "isError": not envelope.ok,
        "structuredContent": to_dict(envelope),
        "content": [{"type": "text", "text": to_text(envelope)}],
    }


def to_openai_output(envelope: AnyEnvelope, call_id: str | None = None) -> dict[str, Any]:
    """An OpenAI ``function_call_output`` item; ``call_id`` defaults to the envelope's."""
    call_id = call_id or envelope.call_id
    if not call_id:
        raise ValueError("a function_call_output needs the call_id of the function call")
    return {"type": "function_call_output", "call_id": call_id, "output": to_json(envelope)}


def to_anthropic_tool_result(
    envelope: AnyEnvelope, tool_use_id: str | None = None
) -> dict[str, Any]:
    """An Anthropic ``tool_result`` block; ``tool_use_id`` defaults to ``call_id``."""
    tool_use_id = tool_use_id or envelope.call_id
    if not tool_use_id:
        raise ValueError("a tool_result needs the id of the tool_use block it answers")
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": to_text(envelope),
        "is_error": not envelope.ok,
    }


# --------------------------------------------------------------------------- the receipt


@dataclass(frozen=True)
class ReceiptRow:
    """One row of :data:`RECEIPT_TABLE`; ``None`` matches anything."""

    commit_state: CommitState | None
    next_action: NextAction | None
    category: Category | None
    code: str | None  # a regex searched in the envelope's code
    error_code: ErrorCode
    next_safe_action: SafeAction

    def matches(self, env: ToolError) -> bool:
        return (
            (self.commit_state is None or env.commit_state is self.commit_state)
            and (self.next_action is None or env.next_action is self.next_action)
            and (self.category is None or env.category is self.category)
            and (self.code is None or re.search(self.code, env.code) is not None)
        )


_NOT_FOUND = r"(?:^|_)(?:NOT_FOUND|GONE)$"
_RATE = r"(?:^|_)RATE_LIMIT"
_TIMEOUT = r"(?:^|_)(?:TIMEOUT|DEADLINE_EXCEEDED)$"
_APPROVAL = r"(?:^|_)APPROVAL(?:_|$)"

_UNKNOWN = CommitState.UNKNOWN
_FIX, _APPROVE = NextAction.CORRECT_INPUT, NextAction.REQUEST_APPROVAL
_CHOOSE, _REREAD = NextAction.CHOOSE_ALLOWED_OPERATION, NextAction.REREAD_STATE
_WAIT, _ESCALATE = NextAction.WAIT_AND_RETRY, NextAction.ESCALATE
_VALIDATION, _AUTHZ, _CONFLICT = Category.VALIDATION, Category.AUTHORIZATION, Category.CONFLICT

#: Envelope -> receipt, first match wins; ``retryable`` is not in the table
#: because it follows from the envelope alone (after_delay and not_committed).
#: Decisions worth knowing:
#:
#: - An unknown outcome is ``timeout`` / ``stop_and_escalate``: the receipt has
#:   no "verify" action, and the agent must neither retry nor reread-and-retry
#:   (a read inside the consistency window can miss the write); toolq's
#:   verification settles it under the same ``operation_ref``.
#: - ``wait_and_retry`` is ``retry_once``: the same request is safe after
#:   ``retry_after_seconds``.
#: - ``escalate`` is ``stop_and_escalate``, keeping the error code the failure
#:   had where the code or category tells it (``APPROVAL_TIMEOUT`` is
#:   ``needs_approval``, ``INPUT_TIMEOUT`` is ``invalid_input``); internal and
#:   other dependency failures (``ATTEMPTS_EXHAUSTED`` included), which the
#:   receipt has no word for, are ``unavailable``.
#: - not_found / rate_limited / timeout are told apart by the code:
#:   ``NOT_FOUND``, ``GONE`` or ``*_NOT_FOUND``; ``RATE_LIMIT*``; ``*_TIMEOUT``
#:   or ``DEADLINE_EXCEEDED``.
RECEIPT_TABLE: tuple[ReceiptRow, ...] = (
    # commit   next_action  category     code        error_code         next_safe_action
    ReceiptRow(_UNKNOWN, None, None, None, "timeout", "stop_and_escalate"),
    ReceiptRow(None, _FIX, None, None, "invalid_input", "repair_input"),
    ReceiptRow(None, _APPROVE, None, None, "needs_approval", "request_approval"),
    ReceiptRow(None, _CHOOSE, None, None, "forbidden_scope", "choose_allowed_operation"),
    ReceiptRow(None, _REREAD, None, _NOT_FOUND, "not_found", "reread_state"),
    ReceiptRow(None, _REREAD, None, None, "conflict", "reread_state"),
    ReceiptRow(None, _WAIT, None, _RATE, "rate_limited", "retry_once"),
    ReceiptRow(None, _WAIT, None, _TIMEOUT, "timeout", "retry_once"),
    ReceiptRow(None, _WAIT, None, None, "unavailable", "retry_once"),
    ReceiptRow(None, _ESCALATE, None, _APPROVAL, "needs_approval", "stop_and_escalate"),
    ReceiptRow(None, _ESCALATE, None, _RATE, "rate_limited", "stop_and_escalate"),
    ReceiptRow(None, _ESCALATE, None, _NOT_FOUND, "not_found", "stop_and_escalate"),
    ReceiptRow(None, _ESCALATE, _VALIDATION, None, "invalid_input", "stop_and_escalate"),
    ReceiptRow(None, _ESCALATE, _AUTHZ, None, "forbidden_scope", "stop_and_escalate"),
    ReceiptRow(None, _ESCALATE, _CONFLICT, None, "conflict", "stop_and_escalate"),
    ReceiptRow(None, _ESCALATE, None, _TIMEOUT, "timeout", "stop_and_escalate"),
    ReceiptRow(None, None, None, None, "unavailable", "stop_and_escalate"),
)


def receipt_row(env: ToolError) -> ReceiptRow:
    """The first row of :data:`RECEIPT_TABLE` that matches ``env``."""
    return next(row for row in RECEIPT_TABLE if row.matches(env))


def _retry_after_seconds(env: ToolError, now: datetime) -> int | None:
    if env.retry.not_before is None:
        return None
    return max(0, math.ceil((env.retry.not_before - now).total_seconds()))


def _field_errors(env: ToolError) -> list[dict[str, str]]:
    if env.field_errors:
        return [{"field": fe.field, "rule": fe.rule} for fe in env.field_errors]
    field = env.safe_details.get("field")
    if isinstance(field, str) and field:
        rule = env.safe_details.get("rule")
        return [{"field": field, "rule": rule if isinstance(rule, str) and rule else "invalid"}]
    return []


def _current_state_ref(env: ToolError) -> str | None:
    if env.current_state_ref:
        return env.current_state_ref
    ref = env.safe_details.get("current_state_ref")
    return ref if isinstance(ref, str) and ref else None


def to_receipt(envelope: AnyEnvelope, *, now: datetime | None = None) -> dict[str, Any]:
    """The failure receipt (or, for a success, ``ok``/ids/``result``).

    ``retry_after_seconds`` counts from ``now`` (default: the current time) to
    ``retry.not_before``, rounded up; it is null when there is nothing to wait
    for.
    """
    ids = {
        "operation": envelope.operation,
        "call_id": envelope.call_id,
        "operation_ref": envelope.operation_ref,
    }
    if isinstance(envelope, ToolSuccess):
        return {"ok": True, **ids, "result": to_dict(envelope)["result"]}
    now = datetime.now(UTC) if now is None else utc(now)
    row = receipt_row(envelope)
    retryable = (
        envelope.retry.directive is Directive.AFTER_DELAY
        and envelope.commit_state is CommitState.NOT_COMMITTED
    )
    return {
        "ok": False,
        **ids,
        "error_code": row.error_code,
        "retryable": retryable,
        "retry_after_seconds": _retry_after_seconds(envelope, now) if retryable else None,
        "safe_detail": envelope.user_message,
        "field_errors": _field_errors(envelope),
        "current_state_ref": _current_state_ref(envelope),
        "next_safe_action": row.next_safe_action,
    }
