"""toolq tools in a real Pydantic AI agent run (``toolq.integrations.pydantic_ai``).

The model is pydantic-ai's ``FunctionModel`` over scripted responses, recording
every message list it is given, which is what a real model would read. The
tools run on a real worker and scheduler over Valkey
(the ``agents_tq`` fixture); the provider counts side effects.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    AgentRunResult,
    FunctionToolset,
    ModelRetry,
    ToolFailed,
    ToolReturn,
    ToolReturnPart,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, ToolDenied

from tests.integration.agents_fixtures import (
    BAD_INVOICE,
    GOOD_INVOICE,
    SECRET,
    TOO_BIG_INVOICE,
    assert_no_upstream_text,
    assert_retried_after_not_before,
    attempts,
    effects,
    run_async,
    run_example,
)
from toolq import State, ToolQueue
from toolq.integrations import pydantic_ai as toolq_pydantic_ai
from toolq.integrations.common import FOLLOW_TOOL


def call(name: str, args: Any, call_id: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=call_id)])


def say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


class Conversation:
    """One agent over scripted model turns, in a conversation of its own."""

    def __init__(
        self,
        tq: ToolQueue,
        turns: list[ModelResponse],
        toolset: FunctionToolset[Any] | None = None,
        **options: Any,
    ) -> None:
        self.tq = tq
        self.id = f"conv-{uuid.uuid4().hex[:12]}"
        self.turns = iter(turns)
        self.received: list[list[ModelMessage]] = []
        options.setdefault("max_retries", 3)
        self.agent = Agent(
            FunctionModel(self._respond),
            toolsets=[toolset or toolq_pydantic_ai.toolset(tq, **options)],
            output_type=[str, DeferredToolRequests],
        )

    def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(list(messages))
        return next(self.turns)

    def ref(self, call_id: str) -> str:
        return f"{self.id}/{call_id}"

    def run(self, after: AgentRunResult[Any] | None = None, **kwargs: Any) -> AgentRunResult[Any]:
        """A first run, or one resumed from ``after``'s messages."""
        if after is None:
            kwargs.update(user_prompt="go", conversation_id=self.id)
        else:
            kwargs.update(message_history=after.all_messages())
        return run_async(self.tq, lambda: self.agent.run(**kwargs))

    def run_to_pause(self) -> tuple[AgentRunResult[Any], DeferredToolRequests]:
        """A first run that ends paused: its result and the calls it deferred."""
        first = self.run()
        assert isinstance(first.output, DeferredToolRequests)
        return first, first.output

    def answers(self) -> dict[str, ToolReturnPart]:
        """The tool answers in the last request the model was given, by call id."""
        last = self.received[-1][-1]
        assert isinstance(last, ModelRequest)
        return {p.tool_call_id: p for p in last.parts if isinstance(p, ToolReturnPart)}


def test_tools_are_every_registered_tool_and_the_follow_tool(agents_tq: ToolQueue) -> None:
    made = toolq_pydantic_ai.tools(agents_tq)
    assert [t.name for t in made] == [t.name for t in agents_tq.registry] + [FOLLOW_TOOL]
    book = made[0]
    assert book.tool_def.parameters_json_schema == agents_tq.registry.get("book").input_schema()
    with pytest.raises(ValueError, match="timeout"):
        toolq_pydantic_ai.toolset(agents_tq, timeout=5)


def test_a_lost_reply_is_one_side_effect_even_when_the_call_is_replayed(
    agents_tq: ToolQueue,
) -> None:
    # Given a write that commits, outlasts the tool's wait, then loses its reply
    args = {"item": "room-12", "lose_reply": True, "sleep": 1.5}
    c = Conversation(
        agents_tq,
        [
            call("book", args, "call_lost"),
            # after the resume, the model repeats the same call, with the same id
            call("book", args, "call_lost"),
            say("booked"),
        ],
        wait=0.3,
    )
    ref = c.ref("call_lost")
    # When the run defers the pending call, and is resumed with its outcome
    first, requests = c.run_to_pause()
    assert [p.tool_call_id for p in requests.calls] == ["call_lost"]
    assert requests.metadata["call_lost"]["operation_ref"] == ref
    assert requests.metadata["call_lost"]["envelope"]["code"] == "OPERATION_PENDING"
    results = run_async(
        agents_tq, lambda: toolq_pydantic_ai.deferred_results(agents_tq, requests, wait=30)
    )
    done = c.run(first, deferred_tool_results=results)
    # Then the model got the verified commit twice, and there was one side effect
    assert done.output == "booked"
    resumed = c.received[1][-1]
    assert isinstance(resumed, ModelRequest)
    (answer,) = [p for p in resumed.parts if isinstance(p, ToolReturnPart)]
    assert answer.content == {"booked": True, "ref": ref}
    assert answer.metadata["ok"] is True and answer.metadata["operation_ref"] == ref
    assert c.answers()["call_lost"].content == answer.content
    assert effects(agents_tq, ref) == 1
    assert attempts(agents_tq, ref) == [1]
    rec = agents_tq.get(ref)
    assert rec is not None and State.VERIFYING in [h.to for h in rec.history]


def test_a_pending_call_told_to_the_model_is_followed_by_its_ref(agents_tq: ToolQueue) -> None:
    # Given a write that outlasts its tool's wait, and a follow tool that waits longer
    args = {"item": "room-14", "sleep": 1.0}
    tools = FunctionToolset(
        [
            toolq_pydantic_ai.tool(agents_tq, "book", wait=0.3, defer_pending=False),
            toolq_pydantic_ai.follow_tool(agents_tq, wait=30),
        ]
    )
    c = Conversation(agents_tq, [], tools)
    ref = c.ref("call_slow")
    c.turns = iter(
        [
            call("book", args, "call_slow"),
            call(FOLLOW_TOOL, {"operation_ref": ref}, "call_follow"),
            say("booked"),
        ]
    )
    # When the model is told the call is pending, and follows its ref
    result = c.run()
    # Then it gets the result, and the write ran once
    assert result.output == "booked"
    pending = c.received[1][-1]
    assert isinstance(pending, ModelRequest)
    (told,) = [p for p in pending.parts if isinstance(p, ToolReturnPart)]
    assert isinstance(told.content, str) and "OPERATION_PENDING" in told.content
    assert FOLLOW_TOOL in told.content
    followed = c.answers()["call_follow"]
    assert followed.content == {"booked": "room-14", "ref": ref}
    assert effects(agents_tq, ref) == 1 and attempts(agents_tq, ref) == [1]


def test_a_rate_limited_call_comes_back_after_not_before_with_one_model_call(
    agents_tq: ToolQueue,
) -> None:
    c = Conversation(
        agents_tq, [call("notify", {"to": "ops", "text": "hi"}, "call_rate"), say("sent")]
    )
    assert c.run().output == "sent"
    ref = c.ref("call_rate")
    assert c.answers()["call_rate"].content == {"sent_to": "ops", "attempt": 2}
    assert attempts(agents_tq, ref) == [1, 2]
    assert effects(agents_tq, ref) == 1
    assert len(c.received) == 2  # the model was asked once about the tool's answer
    assert_retried_after_not_before(agents_tq, ref)


def test_invalid_arguments_come_back_as_model_retry_naming_the_fields(
    agents_tq: ToolQueue,
) -> None:
    c = Conversation(
        agents_tq,
        [
            call("create_invoice", BAD_INVOICE, "call_inv_1"),
            call("create_invoice", TOO_BIG_INVOICE, "call_inv_2"),
            call("create_invoice", GOOD_INVOICE, "call_inv_3"),
            say("invoiced"),
        ],
    )
    assert c.run().output == "invoiced"
    first = _tool_answer(c.received[1])
    assert first.outcome == "retried"  # pydantic-ai's retry signal
    assert first.tool_call_id == "call_inv_1"
    line = str(first.content).splitlines()[0]
    for field in ("customer_id", "amount_cents", "currency"):
        assert f"{field} (" in line
    assert first.retry is not None and first.retry.cause == "model_retry"
    # A rule the tool checks itself: the same signal, and nothing was committed
    second = _tool_answer(c.received[2])
    assert second.outcome == "retried" and "amount_cents (at_most_1000000)" in str(second.content)
    assert effects(agents_tq, c.ref("call_inv_2")) == 0
    third = c.answers()["call_inv_3"]
    assert isinstance(third.content, dict) and third.content["amount_cents"] == 1200
    assert effects(agents_tq, c.ref("call_inv_3")) == 1


def test_an_approval_pauses_the_run_and_the_resume_runs_the_write_once(
    agents_tq: ToolQueue,
) -> None:
    args = {"to_account": "acct_bob", "amount_cents": 5000}
    c = Conversation(agents_tq, [call("transfer", args, "call_pay"), say("transferred")])
    ref = c.ref("call_pay")
    # Given a run that stops at toolq's approval, with nothing written
    first, requests = c.run_to_pause()
    assert [p.tool_call_id for p in requests.approvals] == ["call_pay"]
    assert requests.metadata["call_pay"]["operation_ref"] == ref
    rec = agents_tq.get(ref)
    assert rec is not None and rec.state is State.AWAITING_APPROVAL
    assert attempts(agents_tq, ref) == []
    # When it is approved and the run resumes
    results = requests.build_results(approvals={"call_pay": True})
    done = c.run(first, deferred_tool_results=results)
    # Then the write ran once, approved, and the model got its result
    assert done.output == "transferred"
    assert c.answers()["call_pay"].content == {
        "transferred": 5000,
        "to": "acct_bob",
        "approved": True,
    }
    assert effects(agents_tq, ref) == 1 and attempts(agents_tq, ref) == [1]
    rec = agents_tq.get(ref)
    assert rec is not None and any(h.by == "pydantic-ai:approve" for h in rec.history)


def test_a_denied_approval_is_forwarded_to_toolq_and_nothing_is_written(
    agents_tq: ToolQueue,
) -> None:
    args = {"to_account": "acct_eve", "amount_cents": 900}
    c = Conversation(agents_tq, [call("transfer", args, "call_no"), say("not sent")])
    ref = c.ref("call_no")
    first, requests = c.run_to_pause()
    results = requests.build_results(approvals={"call_no": ToolDenied("Eve is not a customer")})
    run_async(agents_tq, lambda: toolq_pydantic_ai.forward_decisions(agents_tq, requests, results))
    done = c.run(first, deferred_tool_results=results)
    assert done.output == "not sent"
    denied = c.answers()["call_no"]
    assert denied.outcome == "denied" and denied.content == "Eve is not a customer"
    rec = agents_tq.get(ref)
    assert rec is not None and rec.state is State.CANCELLED
    assert any(h.by == "pydantic-ai:reject" for h in rec.history)
    assert effects(agents_tq, ref) == 0 and attempts(agents_tq, ref) == []


def test_a_denial_after_an_operator_approved_reads_what_happened(agents_tq: ToolQueue) -> None:
    # Given a run paused for approval, whose call an operator approves in toolq (the
    # console) and which then completes
    args = {"to_account": "acct_ann", "amount_cents": 300}
    c = Conversation(agents_tq, [call("transfer", args, "call_late"), say("done")])
    ref = c.ref("call_late")
    first, requests = c.run_to_pause()
    agents_tq.approve(ref, by="operator:approve")
    assert agents_tq.wait(ref, timeout=15).ok
    # When the run's user denies it and the decisions are forwarded
    results = requests.build_results(approvals={"call_late": ToolDenied("no")})
    run_async(agents_tq, lambda: toolq_pydantic_ai.forward_decisions(agents_tq, requests, results))
    c.run(first, deferred_tool_results=results)
    # Then toolq's decision stands: one write, and the model reads it rather than the denial
    assert c.answers()["call_late"].content == {
        "transferred": 300,
        "to": "acct_ann",
        "approved": True,
    }
    rec = agents_tq.get(ref)
    assert rec is not None and rec.approved and effects(agents_tq, ref) == 1
    assert not any(h.by == "pydantic-ai:reject" for h in rec.history)


def test_a_secret_in_an_upstream_error_never_reaches_the_model(agents_tq: ToolQueue) -> None:
    c = Conversation(
        agents_tq, [call("lookup_customer", {"customer_id": "cus_1"}, "call_crm"), say("sorry")]
    )
    assert c.run().output == "sorry"
    answer = c.answers()["call_crm"]
    assert answer.outcome == "failed"  # ToolFailed: terminal, no retry
    assert json.loads(str(answer.content).splitlines()[1])["next_action"] == "escalate"
    assert attempts(agents_tq, c.ref("call_crm")) == [1]  # the upstream was really called
    seen = "\n".join(repr(m) for m in c.received[-1])
    assert_no_upstream_text(seen)


def test_deferred_results_are_what_each_tool_would_have_answered(agents_tq: ToolQueue) -> None:
    # Given operations a run deferred: one failed, one the tool found invalid, one done
    prefix = f"deferred-{uuid.uuid4().hex[:8]}"
    submitted = {
        "call_crm": ("lookup_customer", {"customer_id": "cus_1"}),
        "call_big": ("create_invoice", TOO_BIG_INVOICE),
        "call_ok": ("book", {"item": "chair"}),
    }
    for call_id, (name, args) in submitted.items():
        agents_tq.call(name, args, operation_ref=f"{prefix}/{call_id}", timeout=30)
    requests = DeferredToolRequests(
        calls=[
            *(ToolCallPart(name, args, tool_call_id=i) for i, (name, args) in submitted.items()),
            ToolCallPart("elsewhere", {}, tool_call_id="call_other"),
        ],
        metadata={
            **{i: {"operation_ref": f"{prefix}/{i}"} for i in submitted},
            "call_other": {"note": "not toolq's"},
        },
    )
    # When their results are read
    results = run_async(
        agents_tq, lambda: toolq_pydantic_ai.deferred_results(agents_tq, requests, wait=5)
    )
    # Then each is the tool's answer; another tool's call is left alone
    assert set(results.calls) == set(submitted)
    failed, retry, done = (results.calls[i] for i in ("call_crm", "call_big", "call_ok"))
    assert isinstance(failed, ToolFailed) and SECRET not in failed.message
    assert isinstance(retry, ModelRetry) and "amount_cents (at_most_1000000)" in retry.message
    assert isinstance(done, ToolReturn) and done.return_value["booked"] == "chair"
    # and the operation the model will correct with a new call is cancelled
    rec = agents_tq.get(f"{prefix}/call_big")
    assert rec is not None and rec.state is State.CANCELLED


def test_the_example_runs_offline() -> None:
    out = run_example("pydantic_ai_example.py")  # on an embedded server of its own
    assert "one side effect" in out and "approved" in out


def _tool_answer(messages: list[ModelMessage]) -> ToolReturnPart:
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    (part,) = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    return part
