"""toolq tools in a LangGraph agent, offline: a scripted model, real queues.

    pip install 'toolq[langchain]' langchain
    python examples/langgraph_example.py

Starts a local stack (an embedded Valkey, or the server in ``TOOLQ_REDIS_URL``;
a calls worker, a verify worker and the scheduler) and the example invoice
provider (:mod:`toolq.examples.provider`, with its own deduplication off, so
only toolq stands between a retry and a second invoice). Then a
``create_agent`` agent, checkpointed in memory, whose model is a scripted
LangChain chat model, calls ``create_invoice``:

1. for ``cust_lostreply``: the provider commits and drops the reply; toolq
   verifies the outcome by ``operation_ref`` and the model gets the invoice;
2. with ``amount: -5``: an error tool message tells the model to fix ``amount``;
3. corrected, it succeeds;
4. for ``cust_ratelimit``: a 429; toolq's scheduler retries after
   ``Retry-After`` and the model sees one answer;
5. for ``initech``, 250,000 EUR: over the approval limit. The graph pauses
   (``interrupt``); a person approves (``Command(resume=...)``) and the
   invoice is written once;
6. the first call again, same call id (a replayed step): the same invoice.

It prints what the model read for each call and the side effects the provider
counted, and exits 0 when each is as described.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from _stack import SCENARIO, heard, run_scenario
from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from toolq.examples import invoices
from toolq.integrations import langchain as toolq_langchain


class ScriptedChat(BaseChatModel):
    """A chat model that answers with the next scripted message, whatever it is told."""

    script: Iterator[AIMessage]
    #: Every list of messages the model was given: what a real model would read.
    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=next(self.script))])


def script() -> ScriptedChat:
    """The model: one tool call per turn, then a closing message."""
    turns = [
        AIMessage(
            content="",
            tool_calls=[{"type": "tool_call", "name": "create_invoice", "args": a, "id": i}],
        )
        for i, a in SCENARIO
    ]
    return ScriptedChat(script=iter([*turns, AIMessage(content="Invoices created.")]), seen=[])


async def main(thread: str) -> dict[str, str]:
    """Run the agent (approving what it pauses for); what the model read, by call id."""
    model = script()
    agent = create_agent(
        model,
        tools=toolq_langchain.tools(invoices.tq),
        system_prompt="Create the invoices the user asks for.",
        checkpointer=InMemorySaver(),
    )
    # The thread scopes the refs: thread/call_lost, ... (the scripted call ids repeat
    # from one run of this example to the next; a real model's do not).
    config: Any = {"configurable": {"thread_id": thread}}
    state = await agent.ainvoke({"messages": [("user", "Invoice the five customers.")]}, config)
    approved: list[str] = []
    while state.get("__interrupt__"):
        for pause in state["__interrupt__"]:
            request = pause.value
            what = f"{request['name']} {request['args']}"
            print(f"paused for approval: {what} ({request['description']})")
            approved.append(request["tool_call_id"])
        # A person decides here; this one approves. Each pause is answered by its id
        # (several tool calls of one turn can pause at once).
        decisions = {p.id: {"type": "approve"} for p in state["__interrupt__"]}
        state = await agent.ainvoke(Command(resume=decisions), config)
    await invoices.tq.aio.aclose()
    print(f"final answer: {state['messages'][-1].content}")
    read: dict[str, str] = {}
    for m in model.seen[-1]:
        if isinstance(m, ToolMessage):
            heard(read, m.tool_call_id, m.status, str(m.content))
    if approved:
        print(f"approved by a person: {', '.join(approved)}")
    return read


def run() -> int:
    return run_scenario(main, "error")


if __name__ == "__main__":
    sys.exit(run())
