"""toolq tools in a real OpenAI Agents SDK run (``toolq.integrations.openai_agents``).

The model is the SDK's own ``agents.testing.ScriptedModel``: canned tool calls,
and a record of every input it was given, which is what a real model would
read. The tools run on a real worker and scheduler over Valkey
(the ``agents_tq`` fixture); the provider counts side effects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, RunResult
from agents.run_state import RunState
from agents.testing import ScriptedModel, assistant_message, function_call

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
from toolq.integrations import openai_agents
from toolq.integrations.common import FOLLOW_TOOL

CONFIG = RunConfig(tracing_disabled=True)


def run(tq: ToolQueue, steps: list[Any], **options: Any) -> tuple[RunResult, ScriptedModel]:
    """One agent run over ``steps`` (each a model turn); the result and the model."""
    model = ScriptedModel(steps)
    agent = Agent(name="agent", model=model, tools=openai_agents.tools(tq, **options))
    result = run_async(tq, lambda: Runner.run(agent, "go", run_config=CONFIG))
    return result, model


def outputs(model: ScriptedModel) -> dict[str, str]:
    """Every tool output the model was given, by call id (the last input holds them all)."""
    last = model.calls[-1].input
    return {i["call_id"]: i["output"] for i in last if i.get("type") == "function_call_output"}


def test_a_lost_reply_is_one_side_effect_even_when_the_call_is_replayed(
    agents_tq: ToolQueue,
) -> None:
    # Given a write whose reply is lost after it committed
    args = {"item": "room-12", "lose_reply": True, "sleep": 0}
    _, first = run(
        agents_tq,
        [[function_call("book", args, call_id="call_lost_1")], [assistant_message("booked")]],
    )
    # When the same step is replayed: a new run in which the model sends the same call id
    # (inside one run the SDK itself never invokes a call id twice), so the tool runs again
    _, replay = run(
        agents_tq,
        [[function_call("book", args, call_id="call_lost_1")], [assistant_message("booked")]],
    )
    # Then verification settled the unknown outcome as committed, once
    seen = json.loads(outputs(first)["call_lost_1"])
    assert seen == {"booked": True, "ref": "call_lost_1"}
    assert json.loads(outputs(replay)["call_lost_1"]) == seen
    assert effects(agents_tq, "call_lost_1") == 1
    assert attempts(agents_tq, "call_lost_1") == [1]
    rec = agents_tq.get("call_lost_1")
    assert rec is not None and State.VERIFYING in [h.to for h in rec.history]


def test_a_rate_limited_call_comes_back_after_not_before_with_one_model_call(
    agents_tq: ToolQueue,
) -> None:
    _, model = run(
        agents_tq,
        [
            [function_call("notify", {"to": "ops", "text": "hi"}, call_id="call_rate_1")],
            [assistant_message("sent")],
        ],
    )
    assert json.loads(outputs(model)["call_rate_1"]) == {"sent_to": "ops", "attempt": 2}
    assert attempts(agents_tq, "call_rate_1") == [1, 2]
    assert effects(agents_tq, "call_rate_1") == 1
    assert len(model.calls) == 2  # the model was asked once about the tool's answer
    assert_retried_after_not_before(agents_tq, "call_rate_1")


def test_invalid_arguments_come_back_as_the_tool_output_naming_the_fields(
    agents_tq: ToolQueue,
) -> None:
    _, model = run(
        agents_tq,
        [
            [function_call("create_invoice", BAD_INVOICE, call_id="call_inv_1")],
            [function_call("create_invoice", "{not json", call_id="call_inv_2")],
            [function_call("create_invoice", TOO_BIG_INVOICE, call_id="call_inv_3")],
            [function_call("create_invoice", GOOD_INVOICE, call_id="call_inv_4")],
            [assistant_message("invoiced")],
        ],
    )
    out = outputs(model)
    first = out["call_inv_1"]
    assert first.startswith("The arguments do not validate")
    for field in ("customer_id", "amount_cents", "currency"):
        assert f"{field} (" in first.splitlines()[0]
    env = json.loads(first.splitlines()[1])
    assert env["next_action"] == "correct_input" and env["operation_ref"] == "call_inv_1"
    assert "args (object)" in out["call_inv_2"]
    # A rule the tool checks itself: the same signal; the operation is cancelled, since
    # the corrected call is a new one
    assert "amount_cents (at_most_1000000)" in out["call_inv_3"]
    assert agents_tq.get("call_inv_3").state is State.CANCELLED  # type: ignore[union-attr]
    assert json.loads(out["call_inv_4"])["amount_cents"] == 1200
    assert agents_tq.get("call_inv_1") is None  # refused: nothing was submitted
    assert [effects(agents_tq, f"call_inv_{i}") for i in (1, 2, 3, 4)] == [0, 0, 0, 1]


TRANSFER_RESULT = {"transferred": 500, "to": "acc-9", "approved": True}


def transfer_run(tq: ToolQueue, call_id: str) -> tuple[Agent[Any], ScriptedModel]:
    """An agent whose model asks for one ``transfer`` (approval required), then answers."""
    args = {"to_account": "acc-9", "amount_cents": 500}
    model = ScriptedModel(
        [[function_call("transfer", args, call_id=call_id)], [assistant_message("done")]]
    )
    return Agent(name="agent", model=model, tools=openai_agents.tools(tq)), model


async def paused_and_listed(
    tq: ToolQueue, agent: Agent[Any], ref: str
) -> tuple[RunResult, list[str]]:
    """The run, paused for approval, and the refs toolq lists awaiting approval (the
    console's list), checked to hold the call with its arguments."""
    paused = await Runner.run(agent, "go", run_config=CONFIG)
    assert [i.tool_name for i in paused.interruptions] == ["transfer"]
    listed = await tq.aio.list_operations("awaiting_approval")
    rec = await tq.aio.get(ref)
    assert rec is not None and rec.state is State.AWAITING_APPROVAL
    assert rec.args == {"to_account": "acc-9", "amount_cents": 500} and rec.call_id == ref
    return paused, [i.operation_ref for i in listed.items]


def test_an_approval_pauses_the_run_and_the_approved_write_runs_once(
    agents_tq: ToolQueue,
) -> None:
    agent, model = transfer_run(agents_tq, "call_appr_1")

    async def body() -> tuple[list[str], RunResult]:
        paused, listed = await paused_and_listed(agents_tq, agent, "call_appr_1")
        state = paused.to_state()
        for item in paused.interruptions:
            state.approve(item)
        return listed, await Runner.run(agent, state, run_config=CONFIG)

    listed, resumed = run_async(agents_tq, body)

    # While the run was paused the call waited in toolq, as the console lists it,
    # and nothing had reached the provider
    assert "call_appr_1" in listed
    # Approved and resumed: the write ran once, approved, and toolq recorded who approved
    assert resumed.final_output == "done"
    assert json.loads(outputs(model)["call_appr_1"]) == TRANSFER_RESULT
    assert effects(agents_tq, "call_appr_1") == 1
    rec = agents_tq.get("call_appr_1")
    assert rec is not None and "openai-agents:approve" in [h.by for h in rec.history]

    # A replay of the approved step is not asked again and writes nothing new
    args = {"to_account": "acc-9", "amount_cents": 500}
    again, _ = run(
        agents_tq,
        [[function_call("transfer", args, call_id="call_appr_1")], [assistant_message("done")]],
    )
    assert again.interruptions == [] and effects(agents_tq, "call_appr_1") == 1


def test_an_operator_approves_in_toolq_while_the_run_is_paused(agents_tq: ToolQueue) -> None:
    # Given a run paused for approval, its call awaiting approval in toolq
    agent, model = transfer_run(agents_tq, "call_op_1")

    async def body() -> RunResult:
        paused, listed = await paused_and_listed(agents_tq, agent, "call_op_1")
        assert "call_op_1" in listed
        # When an operator approves it in toolq (as the console's button does) and the
        # write completes, then the run's user approves too and the run resumes
        await agents_tq.aio.approve("call_op_1", by="operator:approve")
        await agents_tq.aio.wait("call_op_1", timeout=15)
        state = paused.to_state()
        for item in paused.interruptions:
            state.approve(item)
        await openai_agents.forward_decisions(agents_tq, state)
        return await Runner.run(agent, state, run_config=CONFIG)

    resumed = run_async(agents_tq, body)
    # Then the resumed call reads the one write's result; the second approval wrote nothing
    assert resumed.final_output == "done"
    assert json.loads(outputs(model)["call_op_1"]) == TRANSFER_RESULT
    assert effects(agents_tq, "call_op_1") == 1 and attempts(agents_tq, "call_op_1") == [1]
    rec = agents_tq.get("call_op_1")
    assert rec is not None and rec.state is State.SUCCEEDED
    by = [h.by for h in rec.history]
    assert "operator:approve" in by and "openai-agents:approve" not in by


def test_a_rejection_after_an_operator_approved_reads_what_happened(
    agents_tq: ToolQueue,
) -> None:
    agent, model = transfer_run(agents_tq, "call_late_1")

    async def body() -> RunResult:
        paused, _ = await paused_and_listed(agents_tq, agent, "call_late_1")
        await agents_tq.aio.approve("call_late_1", by="operator:approve")
        await agents_tq.aio.wait("call_late_1", timeout=15)
        state = paused.to_state()
        for item in paused.interruptions:
            state.reject(item)
        await openai_agents.forward_decisions(agents_tq, state)
        return await Runner.run(agent, state, run_config=CONFIG)

    run_async(agents_tq, body)
    # toolq decided first: the write happened once and the model is told so, not "rejected"
    assert json.loads(outputs(model)["call_late_1"]) == TRANSFER_RESULT
    assert effects(agents_tq, "call_late_1") == 1
    rec = agents_tq.get("call_late_1")
    assert rec is not None and "openai-agents:reject" not in [h.by for h in rec.history]


def test_an_operator_cancels_in_toolq_and_the_approved_resume_writes_nothing(
    agents_tq: ToolQueue,
) -> None:
    agent, model = transfer_run(agents_tq, "call_opc_1")

    async def body() -> RunResult:
        paused, _ = await paused_and_listed(agents_tq, agent, "call_opc_1")
        await agents_tq.aio.cancel("call_opc_1", by="operator:cancel")
        state = paused.to_state()
        for item in paused.interruptions:
            state.approve(item)
        await openai_agents.forward_decisions(agents_tq, state)
        return await Runner.run(agent, state, run_config=CONFIG)

    run_async(agents_tq, body)
    assert "OPERATION_CANCELLED" in outputs(model)["call_opc_1"]
    assert effects(agents_tq, "call_opc_1") == 0
    assert agents_tq.get("call_opc_1").state is State.CANCELLED  # type: ignore[union-attr]


def test_an_approved_state_resumed_twice_writes_once(agents_tq: ToolQueue) -> None:
    # Given a run paused for approval, its state saved, then approved
    args = {"to_account": "acc-4", "amount_cents": 400}
    turns = [[function_call("transfer", args, call_id="call_twice_1")], [assistant_message("ok")]]
    first, second = ScriptedModel(turns), ScriptedModel(turns[1:])

    async def body() -> tuple[RunResult, RunResult]:
        agent = Agent(name="agent", model=first, tools=openai_agents.tools(agents_tq))
        paused = await Runner.run(agent, "go", run_config=CONFIG)
        saved = paused.to_state().to_string()
        results = []
        # When the saved, approved state is resumed twice (a resume that crashed after
        # the write and was run again; or two workers resuming it)
        for model in (first, second):
            agent = Agent(name="agent", model=model, tools=openai_agents.tools(agents_tq))
            state = await RunState.from_string(agent, saved)
            for item in state.get_interruptions():
                state.approve(item)
            results.append(await Runner.run(agent, state, run_config=CONFIG))
        return results[0], results[1]

    once, twice = run_async(agents_tq, body)
    # Then both resumes read the one write's result
    assert once.final_output == twice.final_output == "ok"
    assert outputs(first)["call_twice_1"] == outputs(second)["call_twice_1"]
    assert json.loads(outputs(second)["call_twice_1"])["transferred"] == 400
    assert effects(agents_tq, "call_twice_1") == 1 and attempts(agents_tq, "call_twice_1") == [1]


@pytest.mark.parametrize("forward", [True, False])
def test_a_rejected_approval_writes_nothing(agents_tq: ToolQueue, forward: bool) -> None:
    call_id = f"call_rej_{forward}"
    agent, model = transfer_run(agents_tq, call_id)

    async def body() -> RunResult:
        paused, _ = await paused_and_listed(agents_tq, agent, call_id)
        state = paused.to_state()
        for item in paused.interruptions:
            state.reject(item)
        if forward:
            await openai_agents.forward_decisions(agents_tq, state)
        return await Runner.run(agent, state, run_config=CONFIG)

    run_async(agents_tq, body)
    assert "not approved" in outputs(model)[call_id]
    assert effects(agents_tq, call_id) == 0
    rec = agents_tq.get(call_id)
    assert rec is not None
    if forward:  # cancelled in toolq, recorded as the run's rejection
        assert rec.state is State.CANCELLED
        assert rec.history[-1].by == "openai-agents:reject"
    else:  # the SDK never calls a rejected tool: toolq still waits (approval_timeout escalates)
        assert rec.state is State.AWAITING_APPROVAL


@pytest.mark.parametrize("always", ["approve", "reject"])
def test_a_sticky_decision_is_not_asked_again(agents_tq: ToolQueue, always: str) -> None:
    # Given a run paused on its first transfer, decided for every later call of the tool
    first = {"to_account": "acc-1", "amount_cents": 100}
    second = {"to_account": "acc-2", "amount_cents": 200}
    ids = (f"call_st_{always}_1", f"call_st_{always}_2")
    model = ScriptedModel(
        [
            [function_call("transfer", first, call_id=ids[0])],
            [function_call("transfer", second, call_id=ids[1])],
            [assistant_message("done")],
        ]
    )
    agent = Agent(name="agent", model=model, tools=openai_agents.tools(agents_tq))

    async def body() -> RunResult:
        paused = await Runner.run(agent, "go", run_config=CONFIG)
        state = paused.to_state()
        for item in paused.interruptions:
            if always == "approve":
                state.approve(item, always_approve=True)
            else:
                state.reject(item, always_reject=True)
        await openai_agents.forward_decisions(agents_tq, state)
        return await Runner.run(agent, state, run_config=CONFIG)

    resumed = run_async(agents_tq, body)
    # Then the second call was not asked (the run did not stop again)
    assert resumed.interruptions == [] and resumed.final_output == "done"
    later = agents_tq.get(ids[1])
    if always == "approve":  # submitted and approved in toolq when the tool ran
        assert later is not None and later.approved and effects(agents_tq, ids[1]) == 1
        assert "openai-agents:approve" in [h.by for h in later.history]
    else:  # the SDK rejected it without calling the tool: it never reached toolq
        assert later is None and effects(agents_tq, ids[1]) == 0
        assert "not approved" in outputs(model)[ids[1]]


def test_a_secret_in_an_upstream_error_never_reaches_the_model(agents_tq: ToolQueue) -> None:
    _, model = run(
        agents_tq,
        [
            [function_call("lookup_customer", {"customer_id": "c-1"}, call_id="call_leak_1")],
            [assistant_message("sorry")],
        ],
    )
    out = outputs(model)["call_leak_1"]
    env = json.loads(out.splitlines()[1])
    assert env["next_action"] == "escalate" and env["operation_ref"] == "call_leak_1"
    assert attempts(agents_tq, "call_leak_1") == [1]  # the upstream really failed
    for call in model.calls:
        text = json.dumps(call.input)
        assert_no_upstream_text(text)


def test_a_call_past_its_wait_is_pending_and_followed_by_ref(agents_tq: ToolQueue) -> None:
    _, model = run(
        agents_tq,
        [
            [function_call("book", {"item": "slow", "sleep": 1.5}, call_id="call_slow_1")],
            [function_call(FOLLOW_TOOL, {"operation_ref": "call_slow_1"}, call_id="call_f_1")],
            [function_call(FOLLOW_TOOL, {"operation_ref": "made-up"}, call_id="call_f_2")],
            [assistant_message("booked")],
        ],
        wait=0.3,
    )
    out = outputs(model)
    pending = json.loads(out["call_slow_1"].splitlines()[1])
    assert pending["code"] == "OPERATION_PENDING" and pending["operation_ref"] == "call_slow_1"
    assert FOLLOW_TOOL in out["call_slow_1"] and "do not call the tool again" in out["call_slow_1"]
    # toolq_get_operation waits 0.3 s too: it may still be pending, never a second write
    followed = out["call_f_1"]
    assert followed.startswith("{") or "OPERATION_PENDING" in followed
    assert "OPERATION_NOT_FOUND" in out["call_f_2"]
    assert agents_tq.wait("call_slow_1", timeout=15).ok
    assert effects(agents_tq, "call_slow_1") == 1


@pytest.mark.parametrize(
    ("scope", "call_id"),
    [("conv-7", "call_scoped_1"), (lambda ctx: ctx.context["conversation"], "call_scoped_2")],
)
def test_a_scope_prefixes_the_ref(agents_tq: ToolQueue, scope: Any, call_id: str) -> None:
    model = ScriptedModel(
        [
            [function_call("notify", {"to": "a", "text": "b"}, call_id=call_id)],
            [assistant_message("ok")],
        ]
    )
    agent = Agent(name="agent", model=model, tools=openai_agents.tools(agents_tq, scope=scope))
    ctx = {"conversation": "conv-7"}
    run_async(agents_tq, lambda: Runner.run(agent, "go", context=ctx, run_config=CONFIG))
    rec = agents_tq.get(f"conv-7/{call_id}")
    assert rec is not None and rec.state is State.SUCCEEDED and rec.call_id == call_id
    assert agents_tq.get(call_id) is None


def test_the_example_runs_offline(redis_url: str) -> None:
    # On the suite's server (a database of its own), with its own worker and scheduler
    out = run_example("openai_agents_example.py", redis_url)
    assert "side effects: 1" in out


@dataclass
class Conversation:
    conversation_id: str


def test_a_scope_from_the_context_needs_the_context_back_when_a_state_is_restored(
    agents_tq: ToolQueue,
) -> None:
    # Given a run scoped by its context (as docs/integrations.md shows), paused for approval
    args = {"to_account": "acc-5", "amount_cents": 500}
    turns = [[function_call("transfer", args, call_id="call_scope_1")], [assistant_message("ok")]]
    context = Conversation("conv-7")

    def scope(ctx: Any) -> str:
        return str(ctx.context.conversation_id)

    async def body() -> tuple[str | None, RunResult]:
        tools = openai_agents.tools(agents_tq, scope=scope)
        agent = Agent(name="agent", model=ScriptedModel(turns), tools=tools)
        paused = await Runner.run(agent, "go", context=context, run_config=CONFIG)
        saved = paused.to_state().to_string()
        # When it is restored without context_override: the context is the saved dict
        bare = await RunState.from_string(agent, saved)
        for item in bare.get_interruptions():
            bare.approve(item)
        failed: str | None = None
        try:
            await Runner.run(agent, bare, run_config=CONFIG)
        except Exception as exc:  # the scope function cannot read the dict
            failed = f"{type(exc).__name__}: {exc}"
        # And with it: the call reaches its scoped operation
        agent = Agent(name="agent", model=ScriptedModel(turns[1:]), tools=tools)
        state = await RunState.from_string(agent, saved, context_override=context)
        for item in state.get_interruptions():
            state.approve(item)
        return failed, await Runner.run(agent, state, run_config=CONFIG)

    failed, resumed = run_async(agents_tq, body)
    # Then without it the run fails as the docs say; with it, one write under the scope
    assert failed is not None
    assert "'dict' object has no attribute 'conversation_id'" in failed
    assert resumed.final_output == "ok"
    assert effects(agents_tq, "conv-7/call_scope_1") == 1
