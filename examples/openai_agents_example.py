"""toolq tools in an OpenAI Agents SDK run, offline: a scripted model, real queues.

    pip install 'toolq[openai-agents]'
    python examples/openai_agents_example.py

Starts a local stack (an embedded Valkey, or the server in ``TOOLQ_REDIS_URL``;
a calls worker, a verify worker and the scheduler) and the example invoice
provider (:mod:`toolq.examples.provider`, with its own deduplication off, so
only toolq stands between a retry and a second invoice). Then an agent whose
model is the SDK's ``ScriptedModel`` calls ``create_invoice`` four times:

1. for ``cust_lostreply``: the provider commits and drops the reply; toolq
   verifies the outcome by ``operation_ref`` and the model gets the invoice;
2. with ``amount: -5``: the model is told to fix ``amount``;
3. corrected, it succeeds;
4. for ``cust_ratelimit``: a 429; toolq's scheduler retries after
   ``Retry-After`` and the model sees one answer.

It prints what the model read for each call and the side effects the provider
counted, and exits 0 when each is as described.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from _stack import (
    BAD_AMOUNT,
    FIXED_AMOUNT,
    LOST_REPLY,
    RATE_LIMITED,
    invoice_stack,
    new_scope,
    report,
)
from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

from toolq.examples import invoices
from toolq.integrations import openai_agents

CALLS = [
    ("call_lost", LOST_REPLY),
    ("call_bad", BAD_AMOUNT),
    ("call_fixed", FIXED_AMOUNT),
    ("call_limited", RATE_LIMITED),
]


def script() -> ScriptedModel:
    """The model: one tool call per turn, then a closing message."""
    turns: list[Any] = [
        [function_call("create_invoice", args, call_id=call_id)] for call_id, args in CALLS
    ]
    return ScriptedModel([*turns, [assistant_message("Invoices created.")]])


async def main(run_id: str) -> int:
    model = script()
    agent = Agent(
        name="billing",
        instructions="Create the invoices the user asks for.",
        model=model,
        # The run id scopes the refs: run_id/call_lost, ... (the scripted call ids repeat
        # from one run of this example to the next; a real model's do not).
        tools=openai_agents.tools(invoices.tq, scope=run_id),
    )
    result = await Runner.run(
        agent, "Invoice the four customers.", run_config=RunConfig(tracing_disabled=True)
    )
    await invoices.tq.aio.aclose()
    # What the model read: the last input holds every tool output of the run.
    seen = {
        item["call_id"]: item["output"]
        for item in model.calls[-1].input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    for call_id, _ in CALLS:
        print(f"{call_id}: the model read: {seen[call_id].splitlines()[0][:160]}")
    print(f"final output: {result.final_output}")
    return 0 if "amount (" in seen["call_bad"] and seen["call_fixed"].startswith("{") else 1


def run() -> int:
    with invoice_stack() as provider:
        run_id = new_scope()
        code = asyncio.run(main(run_id))
        effects = report(provider, run_id, (i for i, _ in CALLS))
    return code if effects["call_lost"] == 1 else 1


if __name__ == "__main__":
    sys.exit(run())
