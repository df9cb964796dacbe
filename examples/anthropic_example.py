"""toolq tools in the Anthropic SDK's tool runner, offline: a scripted Claude, real queues.

    pip install 'toolq[anthropic]'
    python examples/anthropic_example.py

Starts a local stack (an embedded Valkey, or the server in ``TOOLQ_REDIS_URL``;
a calls worker, a verify worker and the scheduler) and the example invoice
provider (:mod:`toolq.examples.provider`, with its own deduplication off, so
only toolq stands between a retry and a second invoice). The client is the
real ``AsyncAnthropic``; a fake HTTP transport plays Claude, answering each
``POST /v1/messages`` from a script. Claude calls ``create_invoice``:

1. for ``cust_lostreply``: the provider commits and drops the reply; toolq
   verifies the outcome by ``operation_ref`` and Claude gets the invoice;
2. with ``amount: -5``: an ``is_error`` result asks it to fix ``amount``;
3. corrected, it succeeds;
4. for 250,000 EUR: the tool needs approval; Claude is told so, with the ref.

Then a person approves that call in toolq (``decide``), and in a second
conversation Claude follows the ref with ``toolq_get_operation``: the invoice
is created once. It prints what Claude read and the side effects the provider
counted, and exits 0 when each is as described.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import httpx2
from _stack import (
    BAD_AMOUNT,
    FIXED_AMOUNT,
    LOST_REPLY,
    NEEDS_APPROVAL,
    invoice_stack,
    new_scope,
    report,
)
from anthropic import AsyncAnthropic

from toolq.examples import invoices
from toolq.integrations import anthropic as toolq_anthropic
from toolq.integrations.common import FOLLOW_TOOL

CALLS = [
    ("toolu_lost", LOST_REPLY),
    ("toolu_bad", BAD_AMOUNT),
    ("toolu_fixed", FIXED_AMOUNT),
    ("toolu_big", NEEDS_APPROVAL),
]


class ScriptedClaude:
    """The messages API as a script: one assistant reply per request; it keeps what it read."""

    def __init__(self, turns: list[list[dict[str, Any]]]) -> None:
        self.turns = [*turns, [{"type": "text", "text": "Done."}]]
        self.read: dict[str, str] = {}  # tool_use id -> the content of its tool_result

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_result":
                    self.read[block["tool_use_id"]] = block["content"]
        content = self.turns.pop(0)
        stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
        reply = {
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "type": "message",
            "role": "assistant",
            "model": "claude-scripted",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        return httpx2.Response(200, json=reply)


def call(tool_use_id: str, name: str, input: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": tool_use_id, "name": name, "input": input}]


async def converse(claude: ScriptedClaude, prompt: str, scope: str) -> None:
    """One tool-runner loop: until Claude stops calling tools."""
    client = AsyncAnthropic(
        api_key="offline",
        base_url="http://claude.invalid",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(claude)),
    )
    runner = client.beta.messages.tool_runner(
        model="claude-scripted",
        max_tokens=1024,
        messages=[{"role": "user", "content": prompt}],
        # The run id scopes the refs (run_id/toolu_lost, ...): the scripted ids repeat
        # from one run of this example to the next; Claude's do not.
        tools=toolq_anthropic.tools(invoices.tq, scope=scope),
    )
    async for message in runner:
        for block in message.content:
            if block.type == "text":
                print(f"Claude: {block.text}")
    await client.close()


async def main(run_id: str) -> int:
    first = ScriptedClaude([call(i, "create_invoice", args) for i, args in CALLS])
    await converse(first, "Invoice the four customers.", run_id)
    for tool_use_id, _ in CALLS:
        print(f"{tool_use_id}: Claude read: {first.read[tool_use_id].splitlines()[0][:150]}")

    big = f"{run_id}/toolu_big"
    decided = await toolq_anthropic.decide(invoices.tq, big, True)
    print(f"a person approved {big}: {'committed' if decided.ok else decided.code}")

    second = ScriptedClaude([call("toolu_follow", FOLLOW_TOOL, {"operation_ref": big})])
    await converse(second, "The big invoice was approved; check on it.", run_id)
    followed = second.read["toolu_follow"]
    print(f"toolu_follow: Claude read: {followed[:150]}")
    await invoices.tq.aio.aclose()
    fixed = "amount (" in first.read["toolu_bad"] and first.read["toolu_fixed"].startswith("{")
    return 0 if fixed and decided.ok and followed.startswith("{") else 1


def run() -> int:
    with invoice_stack() as provider:
        run_id = new_scope()
        code = asyncio.run(main(run_id))
        effects = report(provider, run_id, (i for i, _ in CALLS))
    return code if effects["toolu_lost"] == effects["toolu_big"] == 1 else 1


if __name__ == "__main__":
    sys.exit(run())
