"""Renderers: MCP, OpenAI, Anthropic and the failure receipt."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, get_args

import mcp.types as mcp_types
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from toolq.core.envelope import (
    CODE_PATTERN,
    SAFE_DETAIL_KEYS,
    AnyEnvelope,
    Category,
    CommitState,
    Directive,
    NextAction,
    ToolError,
    ToolSuccess,
    json_schema,
    parse_envelope,
    to_dict,
)
from toolq.core.own_envelopes import FIXED, fixed_envelope, unverifiable_envelope
from toolq.core.redact import looks_secret
from toolq.core.render import (
    RECEIPT_TABLE,
    SUCCESS_LINE,
    ErrorCode,
    SafeAction,
    receipt_row,
    to_anthropic_tool_result,
    to_mcp_result,
    to_openai_output,
    to_receipt,
)

# The test environment installs the mcp extra (Makefile), and jsonschema with it:
# these checks never turn into silent skips.
SCHEMA_CHECK: Any = importlib.import_module("jsonschema").Draft202012Validator(json_schema())

NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def make_error(
    *,
    code: str = "SOMETHING_FAILED",
    category: Category = Category.DEPENDENCY,
    state: CommitState = CommitState.NOT_COMMITTED,
    action: NextAction = NextAction.ESCALATE,
    **extra: Any,
) -> ToolError:
    directive = {
        NextAction.WAIT_AND_RETRY: Directive.AFTER_DELAY,
        NextAction.CORRECT_INPUT: Directive.AFTER_INPUT_FIX,
    }.get(action, Directive.NEVER)
    retry: dict[str, Any] = {
        "directive": directive,
        "max_attempts_remaining": 0 if directive is Directive.NEVER else 2,
    }
    if directive is Directive.AFTER_DELAY:
        retry["not_before"] = extra.pop("not_before", NOW + timedelta(seconds=2))
    data: dict[str, Any] = {
        "code": code,
        "category": category,
        "commit_state": state,
        "retry": retry,
        "next_action": action,
        "operation_ref": "op-1",
        "operation": "update_account",
        "call_id": "call_9",
        "agent_message": "Agent text.",
        "user_message": "User text.",
    }
    data.update(extra)
    return ToolError.model_validate(data)


SUCCESS = ToolSuccess(
    operation_ref="op-1",
    operation="create_invoice",
    call_id="call_1",
    result={"invoice_id": "inv_42", "total": 12.5, "lines": [1, 2]},
    verification={"checked_at": NOW, "evidence_ref": "inv_42"},
)
FAILURE = make_error(
    code="INVALID_RECIPIENT_ADDRESS",
    category=Category.VALIDATION,
    action=NextAction.CORRECT_INPUT,
    safe_details={"field": "recipient_email"},
    agent_message="recipient_email is invalid; request a corrected address.",
)


# --------------------------------------------------------------------------- shapes


def test_mcp_result_for_an_error() -> None:
    result = to_mcp_result(FAILURE)
    assert set(result) == {"isError", "structuredContent", "content"}
    assert result["isError"] is True
    assert result["structuredContent"] == to_dict(FAILURE)
    [block] = result["content"]
    assert block["type"] == "text"
    line, body = block["text"].split("\n", 1)
    assert line == FAILURE.agent_message
    assert json.loads(body) == result["structuredContent"]


def test_mcp_result_for_a_success() -> None:
    result = to_mcp_result(SUCCESS)
    assert result["isError"] is False
    line, body = result["content"][0]["text"].split("\n", 1)
    assert line == SUCCESS_LINE
    assert parse_envelope(body) == SUCCESS


@pytest.mark.parametrize("env", [SUCCESS, FAILURE], ids=["success", "error"])
def test_mcp_result_is_a_valid_call_tool_result(env: AnyEnvelope) -> None:
    parsed = mcp_types.CallToolResult.model_validate(to_mcp_result(env))
    assert parsed.is_error is (not env.ok)
    assert parsed.structured_content == to_dict(env)


def test_openai_output() -> None:
    out = to_openai_output(FAILURE)
    assert out == {
        "type": "function_call_output",
        "call_id": "call_9",
        "output": out["output"],
    }
    assert parse_envelope(out["output"]) == FAILURE
    assert to_openai_output(SUCCESS, "call_override")["call_id"] == "call_override"


def test_anthropic_tool_result() -> None:
    block = to_anthropic_tool_result(FAILURE, "toolu_01")
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_01"
    assert block["is_error"] is True
    assert block["content"].split("\n", 1)[0] == FAILURE.agent_message
    assert to_anthropic_tool_result(SUCCESS, "toolu_02")["is_error"] is False
    assert to_anthropic_tool_result(SUCCESS)["tool_use_id"] == "call_1"


def test_renderers_need_an_id_to_answer() -> None:
    env = SUCCESS.model_copy(update={"call_id": None})
    with pytest.raises(ValueError, match="call_id"):
        to_openai_output(env)
    with pytest.raises(ValueError, match="tool_use"):
        to_anthropic_tool_result(env)


def test_render_module_imports_no_sdk() -> None:
    import toolq.core.render as render

    source = Path(render.__file__).read_text(encoding="utf-8")
    for sdk in ("import mcp", "import openai", "import anthropic", "from mcp", "from openai"):
        assert sdk not in source


# --------------------------------------------------------------------------- receipt table

# The envelope -> receipt mapping, one row per case (render.RECEIPT_TABLE).
RECEIPT_CASES = """
code                 category       commit_state   next_action               error_code       retry  next_safe_action
INVALID_INPUT        validation     not_committed  correct_input             invalid_input    no     repair_input
MISSING_APPROVAL     authorization  not_committed  request_approval          needs_approval   no     request_approval
FORBIDDEN_SCOPE      authorization  not_committed  choose_allowed_operation  forbidden_scope  no     choose_allowed_operation
NOT_FOUND            conflict       not_committed  reread_state              not_found        no     reread_state
GONE                 conflict       not_committed  reread_state              not_found        no     reread_state
INVOICE_NOT_FOUND    conflict       not_committed  reread_state              not_found        no     reread_state
VERSION_CONFLICT     conflict       not_committed  reread_state              conflict         no     reread_state
NOT_FOUND_ELSEWHERE  conflict       not_committed  reread_state              conflict         no     reread_state
OPERATION_CANCELLED  conflict       not_committed  reread_state              conflict         no     reread_state
RATE_LIMITED         dependency     not_committed  wait_and_retry            rate_limited     yes    retry_once
UPSTREAM_TIMEOUT     dependency     not_committed  wait_and_retry            timeout          yes    retry_once
UNAVAILABLE          dependency     not_committed  wait_and_retry            unavailable      yes    retry_once
OUTCOME_UNKNOWN      dependency     unknown        verify_operation          timeout          no     stop_and_escalate
OUTCOME_UNKNOWN      internal       unknown        verify_operation          timeout          no     stop_and_escalate
OUTCOME_UNVERIFIABLE dependency     unknown        escalate                  timeout          no     stop_and_escalate
VERIFICATION_UNAVAILABLE dependency unknown        escalate                  timeout          no     stop_and_escalate
UPSTREAM_ERROR       internal       not_committed  escalate                  unavailable      no     stop_and_escalate
TOOL_MISCONFIGURED   internal       not_committed  escalate                  unavailable      no     stop_and_escalate
ATTEMPTS_EXHAUSTED   dependency     not_committed  escalate                  unavailable      no     stop_and_escalate
DEADLINE_EXCEEDED    dependency     not_committed  escalate                  timeout          no     stop_and_escalate
RATE_LIMIT_EXCEEDED  dependency     not_committed  escalate                  rate_limited     no     stop_and_escalate
ACCOUNT_NOT_FOUND    dependency     not_committed  escalate                  not_found        no     stop_and_escalate
APPROVAL_TIMEOUT     authorization  not_committed  escalate                  needs_approval   no     stop_and_escalate
ACCOUNT_LOCKED       authorization  not_committed  escalate                  forbidden_scope  no     stop_and_escalate
INPUT_TIMEOUT        validation     not_committed  escalate                  invalid_input    no     stop_and_escalate
INVOICE_CHANGED      conflict       not_committed  escalate                  conflict         no     stop_and_escalate
"""  # noqa: E501 - a table reads better than wrapped rows
RECEIPTS = [line.split() for line in RECEIPT_CASES.strip().splitlines()[1:]]


def _case_envelope(code: str, category: str, state: str, action: str) -> ToolError:
    return make_error(
        code=code,
        category=Category(category),
        state=CommitState(state),
        action=NextAction(action),
    )


@pytest.mark.parametrize(
    ("code", "category", "state", "action", "error_code", "retry", "safe_action"),
    RECEIPTS,
    ids=[f"{row[0]}-{row[3]}" for row in RECEIPTS],
)
def test_receipt_table(
    code: str,
    category: str,
    state: str,
    action: str,
    error_code: str,
    retry: str,
    safe_action: str,
) -> None:
    receipt = to_receipt(_case_envelope(code, category, state, action), now=NOW)
    retryable = retry == "yes"
    assert (receipt["error_code"], receipt["retryable"], receipt["next_safe_action"]) == (
        error_code,
        retryable,
        safe_action,
    )
    assert receipt["retry_after_seconds"] == (2 if retryable else None)


def test_every_row_of_the_receipt_table_is_reachable() -> None:
    assert {receipt_row(_case_envelope(*row[:4])) for row in RECEIPTS} == set(RECEIPT_TABLE)


@pytest.mark.parametrize("code", sorted(FIXED))
def test_every_fixed_envelope_renders_a_receipt_that_repeats_nothing(code: str) -> None:
    """toolq's own envelopes never tell a receipt reader to retry, and an
    escalated one (OUTCOME_UNVERIFIABLE among them) says stop and escalate."""
    env = fixed_envelope(code, "op-1", "pay", "call_1", {"reason": "OUTCOME_UNKNOWN"})
    receipt = to_receipt(env, now=NOW)
    assert receipt["retryable"] is False and receipt["retry_after_seconds"] is None
    assert receipt["safe_detail"] == env.user_message
    if env.next_action is NextAction.ESCALATE:
        assert receipt["next_safe_action"] == "stop_and_escalate"
    assert parse_envelope(to_mcp_result(env)["structuredContent"]) == env


def test_an_unverifiable_outcome_renders_as_unknown_and_escalated() -> None:
    env = unverifiable_envelope("op-1", "pay", "call_1", reason="PAYMENT_TIMEOUT")
    data = to_dict(env)
    assert (data["code"], data["commit_state"], data["next_action"]) == (
        "OUTCOME_UNVERIFIABLE",
        "unknown",
        "escalate",
    )
    assert data["retry"] == {"directive": "never", "max_attempts_remaining": 0}
    assert data["safe_details"] == {"reason": "PAYMENT_TIMEOUT"}
    assert "verify" not in env.user_message.lower()
    receipt = to_receipt(env, now=NOW)
    assert (receipt["error_code"], receipt["next_safe_action"]) == ("timeout", "stop_and_escalate")
    mcp = to_mcp_result(env)
    assert mcp["isError"] is True and mcp["content"][0]["text"].startswith(env.agent_message)


def test_receipt_fields() -> None:
    receipt = to_receipt(FAILURE, now=NOW)
    assert receipt == {
        "ok": False,
        "operation": "update_account",
        "call_id": "call_9",
        "operation_ref": "op-1",
        "error_code": "invalid_input",
        "retryable": False,
        "retry_after_seconds": None,
        "safe_detail": "User text.",
        "field_errors": [{"field": "recipient_email", "rule": "invalid"}],
        "current_state_ref": None,
        "next_safe_action": "repair_input",
    }


def test_receipt_prefers_the_envelope_field_errors_and_state_ref() -> None:
    env = make_error(
        code="VERSION_CONFLICT",
        category=Category.CONFLICT,
        action=NextAction.REREAD_STATE,
        field_errors=[{"field": "version", "rule": "stale"}],
        current_state_ref="acct_1@v9",
        safe_details={"field": "ignored", "current_state_ref": "ignored"},
    )
    receipt = to_receipt(env, now=NOW)
    assert receipt["field_errors"] == [{"field": "version", "rule": "stale"}]
    assert receipt["current_state_ref"] == "acct_1@v9"
    env = make_error(
        code="VERSION_CONFLICT",
        category=Category.CONFLICT,
        action=NextAction.REREAD_STATE,
        safe_details={"field": "version", "rule": "stale", "current_state_ref": "acct_1@v9"},
    )
    receipt = to_receipt(env, now=NOW)
    assert receipt["field_errors"] == [{"field": "version", "rule": "stale"}]
    assert receipt["current_state_ref"] == "acct_1@v9"


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (timedelta(seconds=2), 2),
        (timedelta(seconds=2, microseconds=1), 3),
        (timedelta(milliseconds=1), 1),
        (timedelta(0), 0),
        (timedelta(seconds=-30), 0),
    ],
)
def test_retry_after_seconds_rounds_up_from_now(delay: timedelta, expected: int) -> None:
    env = make_error(code="RATE_LIMITED", action=NextAction.WAIT_AND_RETRY, not_before=NOW + delay)
    assert to_receipt(env, now=NOW)["retry_after_seconds"] == expected


def test_retry_after_seconds_defaults_to_the_current_time() -> None:
    soon = datetime.now(UTC) + timedelta(seconds=30)
    env = make_error(code="RATE_LIMITED", action=NextAction.WAIT_AND_RETRY, not_before=soon)
    assert 29 <= to_receipt(env)["retry_after_seconds"] <= 30


def test_success_receipt() -> None:
    assert to_receipt(SUCCESS) == {
        "ok": True,
        "operation": "create_invoice",
        "call_id": "call_1",
        "operation_ref": "op-1",
        "result": {"invoice_id": "inv_42", "total": 12.5, "lines": [1, 2]},
    }


# --------------------------------------------------------------------------- properties

_line = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=60
)
_refs = st.text("abcdefghijklmnopqrstuvwxyz0123456789_/:-", min_size=1, max_size=40)
_times = st.datetimes(
    min_value=datetime(1971, 1, 1),
    max_value=datetime(9998, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), UTC]),
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
_details = st.dictionaries(
    st.sampled_from(sorted(SAFE_DETAIL_KEYS)),
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=40),
    ),
    max_size=4,
)
_ROWS = [
    (CommitState.NOT_COMMITTED, Directive.AFTER_INPUT_FIX, NextAction.CORRECT_INPUT),
    (CommitState.NOT_COMMITTED, Directive.AFTER_DELAY, NextAction.WAIT_AND_RETRY),
    *[
        (CommitState.NOT_COMMITTED, Directive.NEVER, action)
        for action in (
            NextAction.REQUEST_APPROVAL,
            NextAction.REREAD_STATE,
            NextAction.CHOOSE_ALLOWED_OPERATION,
            NextAction.ESCALATE,
        )
    ],
    (CommitState.UNKNOWN, Directive.NEVER, NextAction.VERIFY_OPERATION),
    (CommitState.UNKNOWN, Directive.NEVER, NextAction.ESCALATE),
]


@st.composite
def errors(draw: st.DrawFn) -> ToolError:
    state, directive, action = draw(st.sampled_from(_ROWS))
    code = draw(st.from_regex(CODE_PATTERN, fullmatch=True).filter(lambda c: len(c) <= 64))
    assume(not looks_secret(code))
    retry: dict[str, Any] = {"directive": directive, "max_attempts_remaining": 0}
    if directive is not Directive.NEVER:
        retry["max_attempts_remaining"] = draw(st.integers(1, 10))
    if directive is Directive.AFTER_DELAY:
        retry["not_before"] = draw(_times)
    data = {
        "code": code,
        "category": draw(st.sampled_from(Category)),
        "commit_state": state,
        "retry": retry,
        "next_action": action,
        "operation_ref": draw(_refs),
        "operation": draw(st.none() | _refs),
        "call_id": draw(st.none() | _refs),
        "safe_details": draw(_details),
        "field_errors": draw(
            st.none() | st.lists(st.fixed_dictionaries({"field": _line, "rule": _line}))
        ),
        "current_state_ref": draw(st.none() | _refs),
        "agent_message": draw(_line),
        "user_message": draw(_line),
    }
    try:
        return ToolError.model_validate(data)
    except ValidationError:
        # Scrubbing can blank or lengthen text past a limit: such input is refused.
        assume(False)
        raise


@st.composite
def successes(draw: st.DrawFn) -> ToolSuccess:
    return ToolSuccess.model_validate(
        {
            "operation_ref": draw(_refs),
            "operation": draw(st.none() | _refs),
            "call_id": draw(st.none() | _refs),
            "result": draw(_json),
            "verification": {
                "checked_at": draw(_times),
                "evidence_ref": draw(st.none() | _refs),
            },
        }
    )


envelopes = st.one_of(errors(), successes())
_RECEIPT_KEYS = {
    "ok",
    "operation",
    "call_id",
    "operation_ref",
    "error_code",
    "retryable",
    "retry_after_seconds",
    "safe_detail",
    "field_errors",
    "current_state_ref",
    "next_safe_action",
}


@settings(max_examples=80, deadline=None)
@given(envelopes)
def test_any_envelope_round_trips_through_json_and_every_renderer(env: AnyEnvelope) -> None:
    from toolq.core.envelope import to_json

    assert parse_envelope(to_json(env)) == env
    assert parse_envelope(json.loads(to_json(env))) == env
    SCHEMA_CHECK.validate(to_dict(env))

    mcp = json.loads(json.dumps(to_mcp_result(env)))
    assert parse_envelope(mcp["structuredContent"]) == env
    assert parse_envelope(mcp["content"][0]["text"].split("\n", 1)[1]) == env
    assert mcp["isError"] is (not env.ok)

    openai = to_openai_output(env, "call_x")
    assert parse_envelope(openai["output"]) == env

    anthropic = to_anthropic_tool_result(env, "toolu_x")
    assert parse_envelope(anthropic["content"].split("\n", 1)[1]) == env
    assert anthropic["is_error"] is (not env.ok)

    receipt = json.loads(json.dumps(to_receipt(env, now=NOW)))
    assert receipt["operation_ref"] == env.operation_ref
    if isinstance(env, ToolSuccess):
        assert receipt["result"] == to_dict(env)["result"]
        return
    assert set(receipt) == _RECEIPT_KEYS
    assert receipt["error_code"] in get_args(ErrorCode)
    assert receipt["next_safe_action"] in get_args(SafeAction)
    assert receipt["retryable"] is (
        env.retry.directive is Directive.AFTER_DELAY
        and env.commit_state is CommitState.NOT_COMMITTED
    )
    assert (receipt["retry_after_seconds"] is None) is (not receipt["retryable"])
    if env.commit_state is CommitState.UNKNOWN:
        assert receipt["next_safe_action"] == "stop_and_escalate"
