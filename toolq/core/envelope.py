"""The contract: every tool result is a typed envelope.

Two shapes, discriminated by ``ok``; field names are the wire format.

``ToolSuccess``  ok=true, committed, with the result and how it was checked.
``ToolError``    ok=false, with a stable code, what is known about the write
                 (``commit_state``), what may be repeated (``retry``) and what
                 to do next (``next_action``).

The models check their own consistency, so an inconsistent envelope cannot be
built or parsed:

- ``commit_state=unknown`` => ``retry.directive=never`` and ``next_action`` is
  ``verify_operation`` (toolq is verifying it) or ``escalate`` (nothing will:
  a person must check); ``next_action=verify_operation`` => ``unknown``. An
  unknown outcome is verified or escalated, never retried.
- ``directive=after_delay`` <=> ``next_action=wait_and_retry``, with an
  absolute, timezone-aware ``not_before`` (serialised as ISO 8601 UTC, ``Z``).
- ``directive=after_input_fix`` <=> ``next_action=correct_input``.
- ``directive=never`` <=> ``max_attempts_remaining=0``: a directive that allows
  a repeat comes with the attempts left, at least one.
- A success is always committed; an error never is.
- ``safe_details`` keys come from an allowlist a tool can extend (validation
  context ``{"safe_detail_keys": ...}``); values are finite scalars; ``null``
  values are dropped, since a missing detail and a null one mean the same.
- Messages are one line, at most ``MESSAGE_MAX`` characters, and pass through
  :func:`toolq.core.redact.scrub`, as do ``safe_details`` strings.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from toolq.core.redact import looks_secret, scrub

MESSAGE_MAX = 280
SAFE_DETAIL_MAX = 200
CODE_MAX = 64
CODE_PATTERN = r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$"
_CODE_RE = re.compile(CODE_PATTERN)

#: Keys any envelope may carry in ``safe_details``. A tool extends the list
#: for its own envelopes (``@tq.tool(safe_details=[...])``), which passes the
#: extra keys through the validation context ``{"safe_detail_keys": ...}``.
SAFE_DETAIL_KEYS: frozenset[str] = frozenset(
    {
        "field",
        "rule",
        "allowed_values",
        "retry_after",
        "resource_version",
        "verification_tool",
        "current_state_ref",
        "reason",
        "attempts_used",
        "max_attempts",
        "deadline",
        "state",
        "tool",
        "limit",
        "http_status",
        "dependency",
    }
)

#: What a tool may put in ``safe_details``; ``None`` is accepted and dropped.
Scalar = str | int | float | bool | None
DetailValue = str | int | float | bool


class Category(StrEnum):
    VALIDATION = "validation"
    AUTHORIZATION = "authorization"
    CONFLICT = "conflict"
    DEPENDENCY = "dependency"
    INTERNAL = "internal"


class CommitState(StrEnum):
    NOT_COMMITTED = "not_committed"
    COMMITTED = "committed"
    UNKNOWN = "unknown"


class Directive(StrEnum):
    NEVER = "never"
    AFTER_DELAY = "after_delay"
    AFTER_INPUT_FIX = "after_input_fix"


class NextAction(StrEnum):
    CORRECT_INPUT = "correct_input"
    WAIT_AND_RETRY = "wait_and_retry"
    VERIFY_OPERATION = "verify_operation"
    REQUEST_APPROVAL = "request_approval"
    REREAD_STATE = "reread_state"
    CHOOSE_ALLOWED_OPERATION = "choose_allowed_operation"
    ESCALATE = "escalate"


def utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime; naive times are refused."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("time must be timezone-aware")
    return value.astimezone(UTC)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _one_line(value: str) -> str:
    # Zl/Zp (U+2028/9) and C0/C1 controls break lines in some renderers too.
    for char in value:
        if unicodedata.category(char) in {"Cc", "Zl", "Zp"}:
            raise ValueError("text must be a single line without control characters")
    return value


def _message(value: str) -> str:
    value = scrub(_one_line(value))
    if not value:
        raise ValueError("messages cannot be blank")
    if len(value) > MESSAGE_MAX:
        raise ValueError(f"messages are at most {MESSAGE_MAX} characters")
    return value


#: An aware time, normalised to UTC, written as ``2025-01-02T03:04:05Z``.
UtcTime = Annotated[
    datetime,
    AfterValidator(utc),
    PlainSerializer(_iso, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
Ref = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_one_line)]
Message = Annotated[str, Field(min_length=1), AfterValidator(_message)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class Retry(_Model):
    directive: Directive
    not_before: UtcTime | None = None
    max_attempts_remaining: int = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Retry:
        if self.directive is Directive.AFTER_DELAY and self.not_before is None:
            raise ValueError("retry.directive after_delay needs an absolute not_before")
        if self.directive is not Directive.AFTER_DELAY and self.not_before is not None:
            raise ValueError("retry.not_before goes only with directive after_delay")
        if self.directive is Directive.NEVER and self.max_attempts_remaining != 0:
            raise ValueError("retry.directive never means max_attempts_remaining 0")
        if self.directive is not Directive.NEVER and self.max_attempts_remaining < 1:
            raise ValueError(
                f"retry.directive {self.directive.value} needs max_attempts_remaining >= 1; "
                "with none left the directive is never"
            )
        return self


class FieldError(_Model):
    field: str = Field(min_length=1, max_length=200)
    rule: str = Field(min_length=1, max_length=200)

    @field_validator("field", "rule")
    @classmethod
    def _clean(cls, value: str) -> str:
        # Checked after scrubbing so that a parsed envelope parses again.
        value = scrub(_one_line(value))
        if not value or len(value) > 200:
            raise ValueError("field_errors entries are 1 to 200 characters")
        return value


class Verification(_Model):
    checked_at: UtcTime
    evidence_ref: Ref | None = None


class ToolSuccess(_Model):
    ok: Literal[True] = True
    operation_ref: Ref
    operation: Ref | None = None
    call_id: Ref | None = None
    commit_state: Literal[CommitState.COMMITTED] = CommitState.COMMITTED
    result: Any = None
    verification: Verification


# A directive that allows a repeat goes with exactly one next action.
_PAIRED_ACTIONS: dict[Directive, NextAction] = {
    Directive.AFTER_DELAY: NextAction.WAIT_AND_RETRY,
    Directive.AFTER_INPUT_FIX: NextAction.CORRECT_INPUT,
}


# An unknown outcome is being verified, or nothing will verify it and a person must.
_UNKNOWN_ACTIONS = frozenset({NextAction.VERIFY_OPERATION, NextAction.ESCALATE})


class ToolError(_Model):
    ok: Literal[False] = False
    code: str = Field(pattern=CODE_PATTERN, max_length=CODE_MAX)
    category: Category
    commit_state: CommitState
    retry: Retry
    next_action: NextAction
    operation_ref: Ref
    operation: Ref | None = None
    call_id: Ref | None = None
    safe_details: dict[str, DetailValue] = Field(default_factory=dict)
    field_errors: list[FieldError] | None = None
    current_state_ref: Ref | None = None
    agent_message: Message
    user_message: Message

    @field_validator("code")
    @classmethod
    def _code(cls, value: str) -> str:
        if looks_secret(value):
            raise ValueError("code looks like a credential")
        return value

    @field_validator("safe_details", mode="before")
    @classmethod
    def _drop_nulls(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: item for key, item in value.items() if item is not None}
        return value

    @field_validator("safe_details")
    @classmethod
    def _allowlisted(
        cls, value: dict[str, DetailValue], info: ValidationInfo
    ) -> dict[str, DetailValue]:
        extra = (info.context or {}).get("safe_detail_keys", ())
        allowed = SAFE_DETAIL_KEYS | frozenset(extra)
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"safe_details keys not in the allowlist: {', '.join(unknown)}")
        cleaned: dict[str, DetailValue] = {}
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"safe_details[{key!r}] must be a finite number")
            if isinstance(item, str):
                item = scrub(item)
                if len(item) > SAFE_DETAIL_MAX:
                    raise ValueError(
                        f"safe_details[{key!r}] is longer than {SAFE_DETAIL_MAX} characters"
                    )
            cleaned[key] = item
        return cleaned

    @model_validator(mode="after")
    def _consistent(self) -> ToolError:
        state, directive, action = self.commit_state, self.retry.directive, self.next_action
        if state is CommitState.COMMITTED:
            raise ValueError("an error envelope cannot say committed")
        unknown = state is CommitState.UNKNOWN
        if action is NextAction.VERIFY_OPERATION and not unknown:
            raise ValueError("next_action verify_operation goes with commit_state unknown, only")
        if unknown and action not in _UNKNOWN_ACTIONS:
            raise ValueError("commit_state unknown goes with verify_operation or escalate, only")
        if unknown and directive is not Directive.NEVER:
            raise ValueError("commit_state unknown requires retry.directive never")
        for paired_directive, paired_action in _PAIRED_ACTIONS.items():
            if (directive is paired_directive) != (action is paired_action):
                raise ValueError(
                    f"retry.directive {paired_directive.value} goes with "
                    f"next_action {paired_action.value}, only"
                )
        return self


AnyEnvelope = ToolSuccess | ToolError
Envelope = Annotated[AnyEnvelope, Field(discriminator="ok")]
_ADAPTER: TypeAdapter[AnyEnvelope] = TypeAdapter(Envelope)


def parse_envelope(
    obj: dict[str, Any] | str | bytes, *, safe_detail_keys: frozenset[str] | None = None
) -> AnyEnvelope:
    """Parse a dict or JSON text into ``ToolSuccess`` or ``ToolError``.

    Raises ``pydantic.ValidationError`` for anything that is not a consistent
    envelope (JSON that does not decode included).
    """
    context = {"safe_detail_keys": safe_detail_keys or frozenset()}
    if isinstance(obj, str | bytes):
        return _ADAPTER.validate_json(obj, context=context)
    return _ADAPTER.validate_python(obj, context=context)


def to_dict(envelope: AnyEnvelope) -> dict[str, Any]:
    """JSON-ready dict of an envelope; absent optional fields are left out."""
    data = envelope.model_dump(mode="json", exclude_none=True)
    if isinstance(envelope, ToolSuccess):
        # exclude_none is for optional envelope fields; a null result is data.
        data["result"] = envelope.model_dump(mode="json", include={"result"})["result"]
    return data


def to_json(envelope: AnyEnvelope) -> str:
    """Compact JSON of an envelope, the form stored in the ledger."""
    return json.dumps(to_dict(envelope), separators=(",", ":"), ensure_ascii=False)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the envelope union (for MCP ``outputSchema`` and docs)."""
    schema = _ADAPTER.json_schema(mode="serialization")
    # MCP requires an object schema at the top; both shapes are objects.
    schema["type"] = "object"
    # to_dict() drops only absent optional fields, so these are always written
    # (pydantic leaves fields with defaults out of "required").
    always = {"ToolSuccess": ("ok", "commit_state", "result"), "ToolError": ("ok", "safe_details")}
    for name, fields in always.items():
        required = schema["$defs"][name].setdefault("required", [])
        required[:0] = [field for field in fields if field not in required]
    schema.setdefault("title", "ToolqEnvelope")
    schema.setdefault(
        "description", "A toolq tool result: ToolSuccess (ok=true) or ToolError (ok=false)."
    )
    return schema


def is_valid_code(code: str) -> bool:
    return len(code) <= CODE_MAX and bool(_CODE_RE.fullmatch(code))
