"""What Flower shows of toolq's tasks (toolq.adapters.broker.messages), as tables: the
arguments a message carries for display, and what a task body's outcome
becomes. The real Flower reads them in tests/integration/test_flower.py.
"""

from __future__ import annotations

import base64
import json

import pytest
from celery import Celery

from toolq.adapters.broker.messages import (
    NOTHING_TO_DO,
    Delivery,
    MessageFactory,
    OperationNotSucceeded,
    Outcome,
    args_repr,
    message_ref,
    task_result,
)


@pytest.mark.parametrize(
    ("tool", "args", "names", "shown"),
    [
        ("create_invoice", ["op_1", 2], ("attempt",), "create_invoice('op_1', attempt=2)"),
        ("pay", ["r/1", 1, 3], ("attempt", "check"), "pay('r/1', attempt=1, check=3)"),
        ("", ["op_1", 2], ("attempt",), "('op_1', 2)"),  # no tool: Celery's own repr
        ("t", ['it\'s "quoted"', 1], ("attempt",), "t('it\\'s \"quoted\"', attempt=1)"),
    ],
)
def test_the_arguments_flower_shows(
    tool: str, args: list[object], names: tuple[str, ...], shown: str
) -> None:
    assert args_repr(tool, args, names) == shown


def test_a_message_carries_the_tool_for_display_and_the_same_arguments() -> None:
    factory = MessageFactory(Celery("t", set_as_current=False), "calls", "verify")

    queue, raw = factory.run("run_81/step_4", 2, tool="create_invoice")
    msg = json.loads(raw)

    assert queue == "calls"
    assert msg["headers"]["argsrepr"] == "create_invoice('run_81/step_4', attempt=2)"
    assert json.loads(base64.b64decode(msg["body"]))[0] == ["run_81/step_4", 2]
    assert message_ref(raw) == "run_81/step_4"
    _, check = factory.verify("r", 1, 3, tool="pay")
    assert json.loads(check)["headers"]["argsrepr"] == "pay('r', attempt=1, check=3)"


@pytest.mark.parametrize(
    "outcome", ["succeeded", "duplicate", "stale", "missing", "held", "refused:cancelled"]
)
def test_a_task_with_nothing_wrong_succeeds_and_says_what_happened(outcome: str) -> None:
    assert task_result(Outcome(outcome)) == outcome


@pytest.mark.parametrize(
    ("outcome", "shown"),
    [
        (Outcome("escalated", "ATTEMPTS_EXHAUSTED"), "escalated ATTEMPTS_EXHAUSTED"),
        (Outcome("failed", "VERSION_CONFLICT"), "failed VERSION_CONFLICT"),
        (Outcome("waiting_retry", "RATE_LIMITED"), "waiting_retry RATE_LIMITED"),
        (Outcome("verifying", None), "verifying"),
        (Outcome("needs_input", "INVALID_INPUT"), "needs_input INVALID_INPUT"),
        (Outcome("awaiting_approval", "MISSING_APPROVAL"), "awaiting_approval MISSING_APPROVAL"),
        (Outcome("queued", "VERIFIED_NOT_COMMITTED"), "queued VERIFIED_NOT_COMMITTED"),
        ("unknown_tool", "unknown_tool"),
        ("not_durable", "not_durable"),
    ],
)
def test_a_task_whose_operation_did_not_succeed_fails(outcome: str, shown: str) -> None:
    with pytest.raises(OperationNotSucceeded) as info:
        task_result(outcome)
    assert str(info.value) == shown


def test_an_outcome_is_the_plain_string_to_everyone_else() -> None:
    o = Outcome("succeeded", "VERIFIED_COMMITTED")
    assert o == "succeeded" and isinstance(o, str) and o.code == "VERIFIED_COMMITTED"
    assert json.dumps(o) == '"succeeded"'


@pytest.mark.parametrize("outcome", list(Delivery))
def test_a_delivery_outcome_is_its_plain_string_everywhere(outcome: Delivery) -> None:
    assert outcome == outcome.value and str(outcome) == f"{outcome}" == outcome.value
    assert json.dumps(outcome) == json.dumps(outcome.value)
    # what the task returns (Flower's result) is the plain string, or the failure names it
    if outcome in NOTHING_TO_DO:
        assert type(task_result(outcome)) is str and task_result(outcome) == outcome.value
    else:
        with pytest.raises(OperationNotSucceeded, match=f"^{outcome.value}$"):
            task_result(outcome)
