"""toolq tools in the Anthropic SDK's tool runner (``toolq.integrations.anthropic``).

The client is the real ``anthropic.AsyncAnthropic``; its HTTP transport is a
fake (``httpx2.MockTransport``) that answers ``POST /v1/messages`` with scripted
assistant messages and keeps every request body, which is what the model
would read. The tools run on a real worker and scheduler over Valkey
(the ``agents_tq`` fixture); the provider counts side effects.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
from anthropic import AsyncAnthropic

from tests.integration.agents_fixtures import (
    assert_no_upstream_text,
    assert_retried_after_not_before,
    attempts,
    effects,
    run_async,
    run_example,
)
from toolq import State, ToolQueue
from toolq.integrations import anthropic as toolq_anthropic
from toolq.integrations.common import FOLLOW_TOOL


def use(tool_use_id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": input}


class Claude:
    """The scripted messages API: one reply per request, every request body kept."""

    def __init__(self, *turns: list[dict[str, Any]]) -> None:
        self.replies = [*turns, [{"type": "text", "text": "done"}]]
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/messages"
        self.requests.append(json.loads(request.content))
        content = self.replies[len(self.requests) - 1]
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        n = len(self.requests)
        return httpx2.Response(
            200,
            json={
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        )

    def results(self) -> dict[str, dict[str, Any]]:
        """Every tool_result the model was sent, by tool_use id (the last one of each)."""
        out: dict[str, dict[str, Any]] = {}
        for body in self.requests:
            for message in body["messages"]:
                if isinstance(message["content"], list):
                    for block in message["content"]:
                        if block.get("type") == "tool_result":
                            out[block["tool_use_id"]] = block
        return out


def converse(tq: ToolQueue, claude: Claude, **options: Any) -> None:
    """One tool-runner loop until the scripted model stops calling tools."""
    transport = httpx2.MockTransport(claude)

    async def body() -> None:
        client = AsyncAnthropic(
            api_key="sk-ant-test",
            base_url="http://anthropic.test",
            http_client=httpx2.AsyncClient(transport=transport),
        )
        runner = client.beta.messages.tool_runner(
            model="claude-test",
            max_tokens=256,
            messages=[{"role": "user", "content": "go"}],
            tools=toolq_anthropic.tools(tq, **options),
        )
        async for _ in runner:
            pass
        await client.close()

    run_async(tq, body)


def envelope(result: dict[str, Any]) -> dict[str, Any]:
    return json.loads(result["content"].splitlines()[1])


def test_a_lost_reply_is_one_side_effect_even_when_the_model_calls_again_with_the_id(
    agents_tq: ToolQueue,
) -> None:
    args = {"item": "room-7", "lose_reply": True}
    claude = Claude([use("toolu_lost_1", "book", args)], [use("toolu_lost_1", "book", args)])
    converse(agents_tq, claude)
    replay = Claude([use("toolu_lost_1", "book", args)])
    converse(agents_tq, replay)

    first = claude.requests[1]["messages"][-1]["content"][0]
    again = claude.requests[2]["messages"][-1]["content"][0]
    assert first["tool_use_id"] == again["tool_use_id"] == "toolu_lost_1"
    assert "is_error" not in first
    assert json.loads(first["content"]) == {"booked": True, "ref": "toolu_lost_1"}
    assert again["content"] == first["content"] == replay.results()["toolu_lost_1"]["content"]
    assert effects(agents_tq, "toolu_lost_1") == 1
    assert attempts(agents_tq, "toolu_lost_1") == [1]
    rec = agents_tq.get("toolu_lost_1")
    assert rec is not None and State.VERIFYING in [h.to for h in rec.history]


def test_a_rate_limited_call_comes_back_after_not_before_with_one_model_call(
    agents_tq: ToolQueue,
) -> None:
    claude = Claude([use("toolu_rate_1", "notify", {"to": "ops", "text": "hi"})])
    converse(agents_tq, claude)
    result = claude.results()["toolu_rate_1"]
    assert "is_error" not in result
    assert json.loads(result["content"]) == {"sent_to": "ops", "attempt": 2}
    assert len(claude.requests) == 2  # one answer for the one call
    assert attempts(agents_tq, "toolu_rate_1") == [1, 2]
    assert effects(agents_tq, "toolu_rate_1") == 1
    assert_retried_after_not_before(agents_tq, "toolu_rate_1")


def test_invalid_arguments_come_back_as_an_error_result_naming_the_fields(
    agents_tq: ToolQueue,
) -> None:
    bad = {"customer_id": "bob", "amount_cents": -1, "currency": "GBP", "memo": "x"}
    good = {"customer_id": "cus_abcd", "amount_cents": 900, "currency": "USD"}
    claude = Claude(
        [use("toolu_inv_1", "create_invoice", bad)],
        [use("toolu_inv_2", "create_invoice", good)],
    )
    converse(agents_tq, claude)
    results = claude.results()
    fix = results["toolu_inv_1"]
    assert fix["is_error"] is True
    line = fix["content"].splitlines()[0]
    for field in ("customer_id", "amount_cents", "currency", "memo"):
        assert f"{field} (" in line
    assert envelope(fix)["next_action"] == "correct_input"
    assert json.loads(results["toolu_inv_2"]["content"])["amount_cents"] == 900
    assert effects(agents_tq, "toolu_inv_1") == 0 and effects(agents_tq, "toolu_inv_2") == 1


def test_an_approval_pauses_and_once_approved_the_write_runs_once(agents_tq: ToolQueue) -> None:
    args = {"to_account": "acc-1", "amount_cents": 250}
    # Given the model asks for an approval-gated transfer
    asked = Claude([use("toolu_appr_1", "transfer", args)])
    converse(agents_tq, asked)
    paused = asked.results()["toolu_appr_1"]
    assert paused["is_error"] is True and envelope(paused)["code"] == "MISSING_APPROVAL"
    assert envelope(paused)["operation_ref"] == "toolu_appr_1"
    assert agents_tq.get("toolu_appr_1").state is State.AWAITING_APPROVAL  # type: ignore[union-attr]
    assert effects(agents_tq, "toolu_appr_1") == 0

    # When a person approves it, and the model follows the ref (and replays its call)
    decided = run_async(agents_tq, lambda: toolq_anthropic.decide(agents_tq, "toolu_appr_1", True))
    follow = Claude(
        [use("toolu_follow_1", FOLLOW_TOOL, {"operation_ref": "toolu_appr_1"})],
        [use("toolu_appr_1", "transfer", args)],
    )
    converse(agents_tq, follow)

    # Then the write ran once, approved
    done = {"transferred": 250, "to": "acc-1", "approved": True}
    assert decided.ok and decided.result == done
    assert json.loads(follow.results()["toolu_follow_1"]["content"]) == done
    assert json.loads(follow.results()["toolu_appr_1"]["content"]) == done
    assert effects(agents_tq, "toolu_appr_1") == 1
    rec = agents_tq.get("toolu_appr_1")
    assert rec is not None and "anthropic:approve" in [h.by for h in rec.history]


def test_a_rejected_approval_cancels_the_operation(agents_tq: ToolQueue) -> None:
    asked = Claude([use("toolu_rej_1", "transfer", {"to_account": "a", "amount_cents": 9})])
    converse(agents_tq, asked)
    env = run_async(agents_tq, lambda: toolq_anthropic.decide(agents_tq, "toolu_rej_1", False))
    assert not env.ok and env.code == "OPERATION_CANCELLED"
    assert agents_tq.get("toolu_rej_1").state is State.CANCELLED  # type: ignore[union-attr]
    assert effects(agents_tq, "toolu_rej_1") == 0


def test_a_secret_in_an_upstream_error_never_reaches_the_model(agents_tq: ToolQueue) -> None:
    claude = Claude([use("toolu_leak_1", "lookup_customer", {"customer_id": "c-1"})])
    converse(agents_tq, claude)
    result = claude.results()["toolu_leak_1"]
    assert result["is_error"] is True and envelope(result)["next_action"] == "escalate"
    assert attempts(agents_tq, "toolu_leak_1") == [1]  # the upstream really failed
    for body in claude.requests:
        text = json.dumps(body)
        assert_no_upstream_text(text)


def test_a_call_past_its_wait_is_pending_and_followed_by_ref(agents_tq: ToolQueue) -> None:
    claude = Claude(
        [use("toolu_slow_1", "book", {"item": "slow", "sleep": 1.5})],
        [use("toolu_f_1", FOLLOW_TOOL, {"operation_ref": "made-up"})],
        [use("toolu_f_2", FOLLOW_TOOL, {"operation_ref": "bad ref"})],
    )
    converse(agents_tq, claude, wait=0.3)
    results = claude.results()
    pending = results["toolu_slow_1"]
    assert pending["is_error"] is True and envelope(pending)["code"] == "OPERATION_PENDING"
    assert envelope(pending)["operation_ref"] == "toolu_slow_1"
    assert FOLLOW_TOOL in pending["content"]
    assert envelope(results["toolu_f_1"])["code"] == "OPERATION_NOT_FOUND"
    assert "operation_ref (pattern)" in results["toolu_f_2"]["content"]
    assert agents_tq.wait("toolu_slow_1", timeout=15).ok
    assert effects(agents_tq, "toolu_slow_1") == 1


def test_a_scope_prefixes_the_ref(agents_tq: ToolQueue) -> None:
    claude = Claude([use("toolu_scoped_1", "notify", {"to": "a", "text": "b"})])
    converse(agents_tq, claude, scope="conv-9")
    rec = agents_tq.get("conv-9/toolu_scoped_1")
    assert rec is not None and rec.state is State.SUCCEEDED and rec.call_id == "toolu_scoped_1"


def test_called_outside_the_runner_it_refuses_rather_than_mint_a_ref(
    agents_tq: ToolQueue,
) -> None:
    book = toolq_anthropic.tool(agents_tq, "book")
    submitted = agents_tq.ledger.stats().get("book|submitted", 0)

    async def body() -> str:
        try:
            await book.call({"item": "nowhere"})
        except Exception as exc:
            return str(exc)
        raise AssertionError("a call without a tool_use id ran")

    text = run_async(agents_tq, body)
    assert "INTERNAL_ERROR" in text
    assert agents_tq.ledger.stats().get("book|submitted", 0) == submitted


def test_answer_serves_a_loop_of_ones_own(agents_tq: ToolQueue) -> None:
    block = use("toolu_own_1", "notify", {"to": "x", "text": "y"})
    result = run_async(agents_tq, lambda: toolq_anthropic.answer(agents_tq, block))
    assert result["tool_use_id"] == "toolu_own_1" and result["is_error"] is False
    assert json.loads(result["content"]) == {"sent_to": "x", "attempt": 2}
    unknown = use("toolu_own_2", "no_such_tool", {})
    refused = run_async(agents_tq, lambda: toolq_anthropic.answer(agents_tq, unknown))
    assert refused["is_error"] is True and envelope(refused)["code"] == "UNKNOWN_TOOL"


def test_the_example_runs_offline(redis_url: str) -> None:
    # On the suite's server (a database of its own), with its own worker and scheduler
    out = run_example("anthropic_example.py", redis_url)
    assert "side effects: 1" in out
