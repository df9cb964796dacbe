"""toolq tools in a real LangGraph agent run (``toolq.integrations.langchain``).

The agent is langchain's ``create_agent`` with an ``InMemorySaver`` checkpointer
(interrupts need one); the model is LangChain's ``GenericFakeChatModel`` with
scripted ``AIMessage`` tool calls, recording every list of messages it is
given, which is what a real model would read. The tools run on a real worker
and scheduler over Valkey (the ``agents_tq`` fixture); the
provider counts side effects.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from tests.integration.agents_fixtures import (
    BAD_INVOICE,
    GOOD_INVOICE,
    TOO_BIG_INVOICE,
    assert_no_upstream_text,
    assert_retried_after_not_before,
    attempts,
    effects,
    run_async,
    run_example,
)
from toolq import State, ToolQueue
from toolq.integrations import langchain as toolq_langchain
from toolq.integrations.common import FOLLOW_TOOL


class ScriptedChat(GenericFakeChatModel):
    """A fake chat model that takes tools and records what it is given."""

    received: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def call(name: str, args: Any, call_id: str) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"type": "tool_call", "name": name, "args": args, "id": call_id}]
    )


class Conversation:
    """One agent and thread over scripted model turns."""

    def __init__(self, tq: ToolQueue, turns: list[AIMessage], tools: list[Any] | None = None):
        self.tq = tq
        self.thread = f"t-{uuid.uuid4().hex[:12]}"
        self.model = ScriptedChat(messages=iter(turns), received=[])
        self.agent = create_agent(
            self.model, tools=tools or toolq_langchain.tools(tq), checkpointer=InMemorySaver()
        )
        self.config: Any = {"configurable": {"thread_id": self.thread}}

    def ref(self, call_id: str) -> str:
        return f"{self.thread}/{call_id}"

    def run(self, given: Any = None) -> dict[str, Any]:
        """An ``ainvoke`` of the agent (a first prompt if ``given`` is None)."""
        given = given or {"messages": [{"role": "user", "content": "go"}]}
        state: dict[str, Any] = run_async(self.tq, lambda: self.agent.ainvoke(given, self.config))
        return state

    def tool_messages(self) -> dict[str, ToolMessage]:
        """The tool messages the model was last given, by call id (the last one per id)."""
        return {m.tool_call_id: m for m in self.model.received[-1] if isinstance(m, ToolMessage)}


def test_tools_are_every_registered_tool_and_the_follow_tool(agents_tq: ToolQueue) -> None:
    made = toolq_langchain.tools(agents_tq, tags=["toolq"])
    names = [t.name for t in made]
    assert names == [t.name for t in agents_tq.registry] + [FOLLOW_TOOL]
    book = made[names.index("book")]
    assert book.args_schema == agents_tq.registry.get("book").input_schema()
    assert book.description.startswith("Book an item")
    assert book.tags == ["toolq"]


def test_a_lost_reply_is_one_side_effect_even_when_the_call_is_replayed(
    agents_tq: ToolQueue,
) -> None:
    # Given a write that commits, outlasts the tool's wait, then loses its reply
    args = {"item": "room-12", "lose_reply": True, "sleep": 1.5}
    tools: list[Any] = [
        toolq_langchain.tool(agents_tq, "book", wait=0.3),
        toolq_langchain.follow_tool(agents_tq, wait=30),
    ]
    c = Conversation(agents_tq, [], tools)
    ref = c.ref("call_lost")
    c.model.messages = iter(
        [
            call("book", args, "call_lost"),
            # the model follows the pending call by its ref ...
            call(FOLLOW_TOOL, {"operation_ref": ref}, "call_follow"),
            # ... and then the step is replayed: the same call, the same id
            call("book", args, "call_lost"),
            AIMessage(content="booked"),
        ]
    )
    # When the agent runs
    c.run()
    # Then the first answer was pending (the model must not call again), the follow and
    # the replay both the verified commit: one side effect, one attempt
    pending = c.model.received[1][-1]
    assert isinstance(pending, ToolMessage) and pending.status == "error"
    assert pending.artifact["code"] == "OPERATION_PENDING"
    assert pending.artifact["operation_ref"] == ref
    assert "do not call the tool again" in str(pending.content)
    followed = c.model.received[2][-1]
    replayed = c.model.received[3][-1]
    assert isinstance(followed, ToolMessage) and isinstance(replayed, ToolMessage)
    assert followed.status == replayed.status == "success"
    assert json.loads(str(followed.content)) == {"booked": True, "ref": ref}
    assert replayed.content == followed.content
    assert replayed.artifact == followed.artifact
    assert effects(agents_tq, ref) == 1
    assert attempts(agents_tq, ref) == [1]
    rec = agents_tq.get(ref)
    assert rec is not None and State.VERIFYING in [h.to for h in rec.history]


def test_a_rate_limited_call_comes_back_after_not_before_with_one_model_call(
    agents_tq: ToolQueue,
) -> None:
    c = Conversation(
        agents_tq,
        [call("notify", {"to": "ops", "text": "hi"}, "call_rate"), AIMessage(content="sent")],
    )
    c.run()
    ref = c.ref("call_rate")
    answer = c.tool_messages()["call_rate"]
    assert answer.status == "success"
    assert json.loads(str(answer.content)) == {"sent_to": "ops", "attempt": 2}
    assert attempts(agents_tq, ref) == [1, 2]
    assert effects(agents_tq, ref) == 1
    assert len(c.model.received) == 2  # the model was asked once about the tool's answer
    assert_retried_after_not_before(agents_tq, ref)


def test_invalid_arguments_come_back_as_an_error_tool_message_naming_the_fields(
    agents_tq: ToolQueue,
) -> None:
    c = Conversation(
        agents_tq,
        [
            call("create_invoice", BAD_INVOICE, "call_inv_1"),
            call("create_invoice", TOO_BIG_INVOICE, "call_inv_2"),
            call("create_invoice", GOOD_INVOICE, "call_inv_3"),
            AIMessage(content="invoiced"),
        ],
    )
    c.run()
    out = c.tool_messages()
    first = out["call_inv_1"]
    assert first.status == "error"
    line = str(first.content).splitlines()[0]
    for field in ("customer_id", "amount_cents", "currency"):
        assert f"{field} (" in line
    assert first.artifact["next_action"] == "correct_input"
    # A rule the tool checks itself: the same signal, and nothing was committed
    second = out["call_inv_2"]
    assert second.status == "error" and "amount_cents (at_most_1000000)" in str(second.content)
    assert effects(agents_tq, c.ref("call_inv_2")) == 0
    rec = agents_tq.get(c.ref("call_inv_2"))
    assert rec is not None and rec.state is State.CANCELLED
    third = out["call_inv_3"]
    assert third.status == "success"
    assert json.loads(str(third.content))["amount_cents"] == 1200
    assert effects(agents_tq, c.ref("call_inv_3")) == 1


def test_an_approval_pauses_the_graph_and_the_resume_runs_the_write_once(
    agents_tq: ToolQueue,
) -> None:
    args = {"to_account": "acct_bob", "amount_cents": 5000}
    c = Conversation(
        agents_tq, [call("transfer", args, "call_pay"), AIMessage(content="transferred")]
    )
    ref = c.ref("call_pay")
    # Given a run that stops at toolq's approval, with nothing written
    state = c.run()
    (pause,) = state["__interrupt__"]
    assert pause.value == {
        "type": "tool_approval",
        "tool_call_id": "call_pay",
        "name": "transfer",
        "args": args,
        "description": pause.value["description"],
        "operation_ref": ref,
    }
    assert pause.response_schema is not None
    rec = agents_tq.get(ref)
    assert rec is not None and rec.state is State.AWAITING_APPROVAL
    assert attempts(agents_tq, ref) == []
    # An answer that is not a decision is refused, and can be given again
    with pytest.raises(ValueError, match="type"):
        c.run(Command(resume={"type": "maybe"}))
    # When it is approved
    state = c.run(Command(resume={"type": "approve"}))
    # Then the write ran once, approved, and the model got its result
    answer = c.tool_messages()["call_pay"]
    assert answer.status == "success"
    assert json.loads(str(answer.content)) == {
        "transferred": 5000,
        "to": "acct_bob",
        "approved": True,
    }
    assert state["messages"][-1].content == "transferred"
    assert effects(agents_tq, ref) == 1 and attempts(agents_tq, ref) == [1]
    rec = agents_tq.get(ref)
    assert rec is not None
    assert any(h.by == "langgraph:approve" for h in rec.history)


def test_a_rejected_approval_cancels_the_operation_and_tells_the_model(
    agents_tq: ToolQueue,
) -> None:
    args = {"to_account": "acct_eve", "amount_cents": 900}
    c = Conversation(agents_tq, [call("transfer", args, "call_no"), AIMessage(content="ok")])
    ref = c.ref("call_no")
    c.run()
    c.run(Command(resume={"type": "reject", "message": "Eve is not a customer"}))
    answer = c.tool_messages()["call_no"]
    assert answer.status == "error"
    assert str(answer.content).startswith("A reviewer rejected this call: Eve is not a customer")
    assert answer.artifact["code"] == "OPERATION_CANCELLED"
    rec = agents_tq.get(ref)
    assert rec is not None and rec.state is State.CANCELLED
    assert rec.history[-1].by == "langgraph:reject"
    assert effects(agents_tq, ref) == 0 and attempts(agents_tq, ref) == []


@pytest.mark.parametrize("resume", ["approve", "reject"])
def test_an_operator_decides_in_toolq_while_the_graph_is_paused(
    agents_tq: ToolQueue, resume: str
) -> None:
    # Given a graph paused for approval, its call listed awaiting approval (the console)
    args = {"to_account": "acct_ann", "amount_cents": 300}
    call_id = f"call_op_{resume}"
    c = Conversation(agents_tq, [call("transfer", args, call_id), AIMessage(content="ok")])
    ref = c.ref(call_id)
    c.run()
    listed = agents_tq.list_operations("awaiting_approval")
    assert ref in [i.operation_ref for i in listed.items]
    # When an operator approves it there and the write completes, then the graph resumes
    agents_tq.approve(ref, by="operator:approve")
    assert agents_tq.wait(ref, timeout=15).ok
    c.run(Command(resume={"type": resume, "message": "no"}))
    # Then the first decision stood: one write, and the model reads its result either way
    answer = c.tool_messages()[call_id]
    assert answer.status == "success" and "rejected" not in str(answer.content)
    assert json.loads(str(answer.content))["transferred"] == 300
    rec = agents_tq.get(ref)
    assert rec is not None and effects(agents_tq, ref) == 1 and attempts(agents_tq, ref) == [1]
    assert not any(h.by.startswith("langgraph:") for h in rec.history)


def test_a_graph_run_without_a_thread_tells_the_model_instead_of_pausing(
    agents_tq: ToolQueue,
) -> None:
    # Given a graph with no checkpointer, run without a thread: a pause could never resume
    args = {"to_account": "acct_ann", "amount_cents": 300}
    model = ScriptedChat(
        messages=iter([call("transfer", args, "call_nothread"), AIMessage(content="asked")]),
        received=[],
    )
    agent = create_agent(model, tools=toolq_langchain.tools(agents_tq))
    given = {"messages": [{"role": "user", "content": "go"}]}
    # When it calls a tool that needs approval
    state = run_async(agents_tq, lambda: agent.ainvoke(given))
    # Then the run goes on: the model is told approval is requested, by the call's ref
    assert "__interrupt__" not in state
    (answer,) = [m for m in model.received[-1] if isinstance(m, ToolMessage)]
    assert answer.status == "error" and answer.artifact["code"] == "MISSING_APPROVAL"
    assert answer.artifact["operation_ref"] == "call_nothread" and FOLLOW_TOOL in answer.text
    rec = agents_tq.get("call_nothread")
    assert rec is not None and rec.state is State.AWAITING_APPROVAL
    assert effects(agents_tq, "call_nothread") == 0


def test_a_secret_in_an_upstream_error_never_reaches_the_model(agents_tq: ToolQueue) -> None:
    c = Conversation(
        agents_tq,
        [call("lookup_customer", {"customer_id": "cus_1"}, "call_crm"), AIMessage(content="x")],
    )
    c.run()
    answer = c.tool_messages()["call_crm"]
    assert answer.status == "error"
    assert answer.artifact["next_action"] == "escalate"
    assert attempts(agents_tq, c.ref("call_crm")) == [1]  # the upstream was really called
    seen = "\n".join(repr(m) for m in c.model.received[-1])
    assert_no_upstream_text(seen)


def test_a_sync_graph_run_works_and_a_sync_call_under_a_running_loop_is_refused(
    agents_tq: ToolQueue,
) -> None:
    c = Conversation(
        agents_tq, [call("book", {"item": "desk"}, "call_sync"), AIMessage(content="booked")]
    )
    # LangGraph's sync invoke: each tool call runs on a private event loop
    c.agent.invoke({"messages": [{"role": "user", "content": "go"}]}, c.config)
    assert c.tool_messages()["call_sync"].status == "success"
    assert effects(agents_tq, c.ref("call_sync")) == 1

    book = toolq_langchain.tool(agents_tq, "book")
    tool_call = {"type": "tool_call", "name": "book", "args": {"item": "x"}, "id": "call_in_loop"}

    async def in_a_loop() -> None:
        book.invoke(tool_call)

    with pytest.raises(RuntimeError, match="ainvoke"):
        asyncio.run(in_a_loop())
    assert agents_tq.get("call_in_loop") is None


def test_plain_arguments_without_a_tool_call_are_refused(agents_tq: ToolQueue) -> None:
    book = toolq_langchain.tool(agents_tq, "book")
    with pytest.raises(ValueError, match="ToolCall"):
        run_async(agents_tq, lambda: book.ainvoke({"item": "x"}))
    # A ToolCall outside a graph: the call id alone is the ref
    call_ = {"type": "tool_call", "name": "book", "args": {"item": "lamp"}, "id": "call_bare"}
    answer = run_async(agents_tq, lambda: book.ainvoke(call_))
    assert isinstance(answer, ToolMessage) and answer.status == "success"
    assert effects(agents_tq, "call_bare") == 1


def test_the_example_runs_offline() -> None:
    out = run_example("langgraph_example.py")  # on an embedded server of its own
    assert "one side effect" in out and "approved" in out
