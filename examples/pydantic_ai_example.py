"""toolq tools in a Pydantic AI agent, offline: a scripted model, real queues.

    pip install 'toolq[pydantic-ai]'
    python examples/pydantic_ai_example.py

Starts a local stack (an embedded Valkey, or the server in ``TOOLQ_REDIS_URL``;
a calls worker, a verify worker and the scheduler) and the example invoice
provider (:mod:`toolq.examples.provider`, with its own deduplication off, so
only toolq stands between a retry and a second invoice). Then an agent whose
model is pydantic-ai's ``FunctionModel`` over a script, with every toolq tool
as a toolset, calls ``create_invoice``:

1. for ``cust_lostreply``: the provider commits and drops the reply; toolq
   verifies the outcome by ``operation_ref`` and the model gets the invoice;
2. with ``amount: -5``: ``ModelRetry`` asks the model to fix ``amount``;
3. corrected, it succeeds;
4. for ``cust_ratelimit``: a 429; toolq's scheduler retries after
   ``Retry-After`` and the model sees one answer;
5. for ``initech``, 250,000 EUR: over the approval limit. The run ends with
   ``DeferredToolRequests``; a person approves and the run is resumed with
   ``DeferredToolResults``: the invoice is written once;
6. the first call again, same call id (a replayed step): the same invoice.

It prints what the model read for each call and the side effects the provider
counted, and exits 0 when each is as described.
"""

from __future__ import annotations

import sys

from _stack import SCENARIO, heard, run_scenario
from pydantic_ai import Agent, ToolReturnPart
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from toolq.examples import invoices
from toolq.integrations import pydantic_ai as toolq_pydantic_ai


class Script:
    """The model: one tool call per turn, then a closing message; it records what it
    was given, which is what a real model would read."""

    def __init__(self) -> None:
        turns = [ModelResponse(parts=[ToolCallPart("create_invoice", a, i)]) for i, a in SCENARIO]
        self.turns = iter([*turns, ModelResponse(parts=[TextPart("Invoices created.")])])
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        return next(self.turns)


async def main(conversation: str) -> dict[str, str]:
    """Run the agent (approving what it pauses for); what the model read, by call id."""
    model = Script()
    agent = Agent(
        FunctionModel(model),
        instructions="Create the invoices the user asks for.",
        toolsets=[toolq_pydantic_ai.toolset(invoices.tq, max_retries=2)],
        output_type=[str, DeferredToolRequests],
    )
    # The conversation scopes the refs: conversation/call_lost, ... (the scripted call
    # ids repeat from one run of this example to the next; a real model's do not).
    result = await agent.run("Invoice the five customers.", conversation_id=conversation)
    approved: list[str] = []
    while isinstance(result.output, DeferredToolRequests):
        requests = result.output
        for c in requests.approvals:
            envelope = requests.metadata[c.tool_call_id]["envelope"]
            print(f"paused for approval: {c.tool_name} {c.args} ({envelope['user_message']})")
            approved.append(c.tool_call_id)
        # A person decides here; this one approves. Calls deferred while pending get
        # their outcome from toolq.
        results = requests.build_results(approve_all=True)
        results.update(await toolq_pydantic_ai.deferred_results(invoices.tq, requests))
        await toolq_pydantic_ai.forward_decisions(invoices.tq, requests, results)
        result = await agent.run(
            message_history=result.all_messages(), deferred_tool_results=results
        )
    await invoices.tq.aio.aclose()
    print(f"final answer: {result.output}")
    read: dict[str, str] = {}
    for message in model.seen[-1]:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                heard(read, part.tool_call_id, part.outcome, part.model_response_str())
    if approved:
        print(f"approved by a person: {', '.join(approved)}")
    return read


def run() -> int:
    return run_scenario(main, "retried")


if __name__ == "__main__":
    sys.exit(run())
