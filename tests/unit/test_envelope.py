"""The envelope contract: published examples, consistency rules, wire format."""

from __future__ import annotations

import importlib
import itertools
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from toolq.core.envelope import (
    MESSAGE_MAX,
    Category,
    CommitState,
    Directive,
    NextAction,
    Retry,
    ToolError,
    ToolSuccess,
    is_valid_code,
    json_schema,
    parse_envelope,
    to_dict,
    to_json,
)

# Copied exactly from seeds/000_*.txt ("Agent Tool Error Envelopes").
PUBLISHED_VALIDATION = """{
  "ok": false,
  "code": "INVALID_RECIPIENT_ADDRESS",
  "category": "validation",
  "commit_state": "not_committed",
  "retry": { "directive": "after_input_fix", "max_attempts_remaining": 1 },
  "next_action": "correct_input",
  "operation_ref": "run_81/step_4",
  "safe_details": { "field": "recipient_email" },
  "agent_message": "recipient_email is invalid; request a corrected address.",
  "user_message": "I need a valid recipient address before I can send this."
}"""

PUBLISHED_UNKNOWN = """{
  "ok": false,
  "code": "OUTCOME_UNKNOWN",
  "category": "dependency",
  "commit_state": "unknown",
  "retry": { "directive": "never", "max_attempts_remaining": 0 },
  "next_action": "verify_operation",
  "operation_ref": "run_81/step_4",
  "safe_details": { "verification_tool": "get_invoice_by_operation_ref" },
  "agent_message": "The write may have completed. Verify operation_ref before any new write.",
  "user_message": "The request is being checked before anything is sent again."
}"""

PUBLISHED = [PUBLISHED_VALIDATION, PUBLISHED_UNKNOWN]
NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
T = "2025-03-04T05:06:09Z"


def error(**overrides: Any) -> dict[str, Any]:
    """A valid ToolError dict (a rate limit) with ``overrides`` applied."""
    data: dict[str, Any] = {
        "ok": False,
        "code": "RATE_LIMITED",
        "category": "dependency",
        "commit_state": "not_committed",
        "retry": {
            "directive": "after_delay",
            "not_before": "2025-03-04T05:06:09Z",
            "max_attempts_remaining": 2,
        },
        "next_action": "wait_and_retry",
        "operation_ref": "op-1",
        "safe_details": {"retry_after": 2},
        "agent_message": "Rate limited; toolq retries after not_before.",
        "user_message": "The service is busy; this will be retried shortly.",
    }
    data.update(overrides)
    return data


def success(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "ok": True,
        "operation_ref": "op-1",
        "commit_state": "committed",
        "result": {"id": "inv_1"},
        "verification": {"checked_at": "2025-03-04T05:06:07Z"},
    }
    data.update(overrides)
    return data


# --------------------------------------------------------------------------- published examples


@pytest.mark.parametrize("text", PUBLISHED, ids=["validation", "outcome_unknown"])
def test_published_examples_parse_unchanged(text: str) -> None:
    env = parse_envelope(text)
    assert isinstance(env, ToolError)
    assert to_dict(env) == json.loads(text)
    assert parse_envelope(json.loads(text)) == env
    assert parse_envelope(text.encode()) == env


def test_published_unknown_example_says_verify() -> None:
    env = parse_envelope(PUBLISHED_UNKNOWN)
    assert isinstance(env, ToolError)
    assert env.commit_state is CommitState.UNKNOWN
    assert env.retry.directive is Directive.NEVER
    assert env.next_action is NextAction.VERIFY_OPERATION
    assert env.operation is None and env.call_id is None and env.field_errors is None


def test_parse_discriminates_on_ok() -> None:
    assert isinstance(parse_envelope(success()), ToolSuccess)
    assert isinstance(parse_envelope(json.dumps(error())), ToolError)


@pytest.mark.parametrize("bad", ["not json", b"{", "[]", "null", '{"ok": "yes"}', "{}"])
def test_parse_rejects_what_is_not_an_envelope(bad: str | bytes) -> None:
    with pytest.raises(ValidationError):
        parse_envelope(bad)


# --------------------------------------------------------------------------- consistency

_ALLOWED = {
    (CommitState.NOT_COMMITTED, Directive.AFTER_INPUT_FIX, NextAction.CORRECT_INPUT),
    (CommitState.NOT_COMMITTED, Directive.AFTER_DELAY, NextAction.WAIT_AND_RETRY),
    (CommitState.NOT_COMMITTED, Directive.NEVER, NextAction.REQUEST_APPROVAL),
    (CommitState.NOT_COMMITTED, Directive.NEVER, NextAction.REREAD_STATE),
    (CommitState.NOT_COMMITTED, Directive.NEVER, NextAction.CHOOSE_ALLOWED_OPERATION),
    (CommitState.NOT_COMMITTED, Directive.NEVER, NextAction.ESCALATE),
    (CommitState.UNKNOWN, Directive.NEVER, NextAction.VERIFY_OPERATION),
    # an unknown outcome nothing will verify (no verifier, verifier down): a person checks
    (CommitState.UNKNOWN, Directive.NEVER, NextAction.ESCALATE),
}


def _retry_for(directive: Directive) -> dict[str, Any]:
    if directive is Directive.NEVER:
        return {"directive": "never", "max_attempts_remaining": 0}
    retry: dict[str, Any] = {"directive": directive.value, "max_attempts_remaining": 1}
    if directive is Directive.AFTER_DELAY:
        retry["not_before"] = "2025-03-04T05:06:09Z"
    return retry


@pytest.mark.parametrize(
    ("state", "directive", "action"),
    list(itertools.product(CommitState, Directive, NextAction)),
    ids=lambda v: v.value,
)
def test_every_state_directive_action_combination(
    state: CommitState, directive: Directive, action: NextAction
) -> None:
    """All 63 combinations: exactly the eight in _ALLOWED parse."""
    data = error(
        commit_state=state.value,
        retry=_retry_for(directive),
        next_action=action.value,
        safe_details={},
    )
    if (state, directive, action) in _ALLOWED:
        assert parse_envelope(data).commit_state is state
    else:
        with pytest.raises(ValidationError):
            parse_envelope(data)


@pytest.mark.parametrize(
    "retry",
    [
        {"directive": "after_delay", "max_attempts_remaining": 2},  # no not_before
        {"directive": "after_delay", "not_before": None, "max_attempts_remaining": 2},
        {
            "directive": "after_delay",
            "not_before": "2025-03-04T05:06:09",
            "max_attempts_remaining": 2,
        },
        {"directive": "after_delay", "not_before": "tomorrow", "max_attempts_remaining": 2},
        {
            "directive": "after_delay",
            "not_before": "2025-03-04T05:06:09Z",
            "max_attempts_remaining": 0,
        },
        {"directive": "after_input_fix", "max_attempts_remaining": 0},
        {
            "directive": "after_input_fix",
            "not_before": "2025-03-04T05:06:09Z",
            "max_attempts_remaining": 1,
        },
        {"directive": "never", "max_attempts_remaining": 1},
        {"directive": "never", "not_before": T, "max_attempts_remaining": 0},
        {
            "directive": "after_delay",
            "not_before": "2025-03-04T05:06:09Z",
            "max_attempts_remaining": -1,
        },
        {"directive": "sometime", "max_attempts_remaining": 0},
        {"directive": "never"},
    ],
)
def test_inconsistent_retry_is_rejected(retry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Retry.model_validate(retry)


@pytest.mark.parametrize(
    "overrides",
    [
        {"commit_state": "committed"},
        {"ok": True},
        {"category": "network"},
        {"next_action": "retry"},
        {"commit_state": "maybe"},
        {"code": "rate_limited"},
        {"code": "Rate-Limited"},
        {"code": "RATE__LIMITED"},
        {"code": "_RATE"},
        {"code": "1RATE"},
        {"code": "RATE_LIMITED\n"},
        {"code": "A" * 65},
        {"code": "AKIAABCDEFGHIJKLMNOP"},
        {"code": ""},
        {"operation_ref": ""},
        {"operation_ref": "op\n1"},
        {"call_id": "x" * 201},
        {"agent_message": "line one\nline two"},
        {"user_message": "carriage\rreturn"},
        {"agent_message": "tab\tseparated"},
        {"agent_message": "para\u2029graph"},
        {"agent_message": "x" * (MESSAGE_MAX + 1)},
        {"agent_message": ""},
        {"user_message": "   "},
        {"safe_details": {"stack": "Traceback (most recent call last)"}},
        {"safe_details": {"field": ["a", "b"]}},
        {"safe_details": {"field": {"nested": 1}}},
        {"safe_details": {"limit": float("nan")}},
        {"safe_details": {"limit": float("inf")}},
        {"safe_details": {"field": "x" * 201}},
        {"field_errors": [{"field": "a"}]},
        {"field_errors": [{"field": "", "rule": "required"}]},
        {"field_errors": [{"field": "a", "rule": "required", "hint": "x"}]},
        {"unexpected": 1},
        {"retry": {"directive": "never", "max_attempts_remaining": 0}},  # with wait_and_retry
    ],
)
def test_inconsistent_or_unsafe_error_is_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_envelope(error(**overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        {"ok": False},
        {"commit_state": "unknown"},
        {"commit_state": "not_committed"},
        {"verification": {"checked_at": "2025-03-04T05:06:07"}},  # naive
        {"verification": {}},
        {"operation_ref": ""},
        {"extra": True},
    ],
)
def test_inconsistent_success_is_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_envelope(success(**overrides))


def test_enums_are_closed_and_match_the_design() -> None:
    assert {c.value for c in Category} == {
        "validation",
        "authorization",
        "conflict",
        "dependency",
        "internal",
    }
    assert {c.value for c in CommitState} == {"not_committed", "committed", "unknown"}
    assert {d.value for d in Directive} == {"never", "after_delay", "after_input_fix"}
    assert {a.value for a in NextAction} == {
        "correct_input",
        "wait_and_retry",
        "verify_operation",
        "request_approval",
        "reread_state",
        "choose_allowed_operation",
        "escalate",
    }


# --------------------------------------------------------------------------- times


def test_not_before_is_normalised_to_utc_and_written_with_z() -> None:
    plus_two = timezone(timedelta(hours=2))
    retry = Retry(
        directive=Directive.AFTER_DELAY,
        not_before=datetime(2025, 3, 4, 7, 6, 9, tzinfo=plus_two),
        max_attempts_remaining=1,
    )
    assert retry.not_before == datetime(2025, 3, 4, 5, 6, 9, tzinfo=UTC)
    assert retry.not_before is not None and retry.not_before.tzinfo is UTC
    assert retry.model_dump(mode="json")["not_before"] == "2025-03-04T05:06:09Z"
    env = parse_envelope(error(retry=retry.model_dump(mode="json")))
    assert '"not_before":"2025-03-04T05:06:09Z"' in to_json(env)


def test_not_before_with_offset_parses_to_utc() -> None:
    data = error()
    data["retry"]["not_before"] = "2025-03-04T00:06:09-05:00"
    env = parse_envelope(data)
    assert isinstance(env, ToolError)
    assert to_dict(env)["retry"]["not_before"] == "2025-03-04T05:06:09Z"


def test_naive_times_are_refused_when_built() -> None:
    with pytest.raises(ValidationError):
        Retry(
            directive=Directive.AFTER_DELAY,
            not_before=datetime(2025, 1, 1),
            max_attempts_remaining=1,
        )


def test_python_dump_keeps_datetimes() -> None:
    env = parse_envelope(success())
    assert isinstance(env, ToolSuccess)
    assert isinstance(env.model_dump()["verification"]["checked_at"], datetime)


# --------------------------------------------------------------------------- details and messages


def test_safe_details_allowlist_can_be_extended_per_tool() -> None:
    data = error(safe_details={"invoice_state": "paid"})
    with pytest.raises(ValidationError, match="invoice_state"):
        parse_envelope(data)
    env = parse_envelope(data, safe_detail_keys=frozenset({"invoice_state"}))
    assert isinstance(env, ToolError)
    assert env.safe_details == {"invoice_state": "paid"}
    built = ToolError.model_validate(data, context={"safe_detail_keys": {"invoice_state"}})
    assert built == env


def test_safe_details_scalars_keep_their_type_and_nulls_are_dropped() -> None:
    details = {"field": "to", "limit": 3, "retry_after": 1.5, "state": True, "rule": None}
    env = parse_envelope(error(safe_details=details))
    assert isinstance(env, ToolError)
    assert env.safe_details == {"field": "to", "limit": 3, "retry_after": 1.5, "state": True}
    assert type(env.safe_details["state"]) is bool
    assert parse_envelope(to_json(env)) == env


def test_messages_and_details_are_scrubbed_at_construction() -> None:
    env = parse_envelope(
        error(
            agent_message="Upstream said: Authorization: Bearer abcdefghijklmnop0123",
            safe_details={"reason": "token=hunter2hunter2"},
        )
    )
    assert isinstance(env, ToolError)
    text = to_json(env)
    assert "abcdefghijklmnop0123" not in text and "hunter2" not in text
    assert "[redacted]" in env.agent_message
    assert parse_envelope(text) == env  # scrubbing is stable


def test_message_length_cap_is_inclusive() -> None:
    env = parse_envelope(error(agent_message="x" * MESSAGE_MAX))
    assert isinstance(env, ToolError) and len(env.agent_message) == MESSAGE_MAX


def test_success_with_null_result_keeps_the_key() -> None:
    env = parse_envelope(success(result=None, operation="send", call_id="call_1"))
    data = to_dict(env)
    assert data["result"] is None and "result" in data
    assert data["operation"] == "send" and data["call_id"] == "call_1"
    assert "evidence_ref" not in data["verification"]
    assert parse_envelope(to_json(env)) == env


def test_is_valid_code() -> None:
    assert is_valid_code("OUTCOME_UNKNOWN") and is_valid_code("E2E")
    assert not is_valid_code("outcome_unknown") and not is_valid_code("A\n")


# --------------------------------------------------------------------------- schema


def test_json_schema_covers_both_shapes() -> None:
    schema = json_schema()
    assert schema["type"] == "object"
    assert {"ToolSuccess", "ToolError"} <= set(schema["$defs"])
    assert {"ok", "commit_state", "result", "verification"} <= set(
        schema["$defs"]["ToolSuccess"]["required"]
    )
    error_def = schema["$defs"]["ToolError"]
    assert set(error_def["required"]) >= {
        "ok",
        "safe_details",
        "code",
        "category",
        "commit_state",
        "retry",
        "next_action",
        "operation_ref",
        "agent_message",
        "user_message",
    }
    retry_def = schema["$defs"]["Retry"]
    assert {"type": "string", "format": "date-time"} in retry_def["properties"]["not_before"][
        "anyOf"
    ]
    json.dumps(schema)


@pytest.mark.parametrize("text", PUBLISHED, ids=["validation", "outcome_unknown"])
def test_published_examples_validate_against_the_schema(text: str) -> None:
    jsonschema = importlib.import_module("jsonschema")  # installed with the mcp extra
    jsonschema.validate(json.loads(text), json_schema())
    jsonschema.validate(to_dict(parse_envelope(success())), json_schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in json.loads(text).items() if k != "ok"}, json_schema())
