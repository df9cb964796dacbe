"""LangChain / LangGraph: each toolq tool as a LangChain ``BaseTool``.

    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command
    from toolq.integrations import langchain as toolq_langchain

    agent = create_agent(model, tools=toolq_langchain.tools(tq), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "conversation-42"}}
    state = await agent.ainvoke({"messages": [("user", "Pay Bob 50 EUR")]}, config)
    while state.get("__interrupt__"):                  # toolq approvals
        decisions = {p.id: {"type": "approve"} for p in state["__interrupt__"]}
        state = await agent.ainvoke(Command(resume=decisions), config)

Works with any LangGraph graph that runs tools through a ``ToolNode`` (and
with ``create_agent``); a plain ``tool.ainvoke(tool_call)`` works too.

- **The ref** is ``<thread_id>/<tool_call_id>`` (:func:`toolq.integrations.common.stable_ref`):
  the id of the model's ``ToolCall``, scoped by the LangGraph thread
  (``config["configurable"]["thread_id"]``) when there is one. LangGraph
  replays a step from its checkpoint with the same ``AIMessage``, so a resumed,
  retried or replayed tool call reaches the same operation and never writes
  twice. A tool must be invoked with a whole ``ToolCall``
  (``{"type": "tool_call", "id": ..., "name": ..., "args": ...}``), as
  ``ToolNode`` does; plain arguments are refused with ``ValueError``, since
  they carry nothing stable to key the write by. Tool-call ids must be unique
  within a thread: providers' ids are (``call_...``, ``toolu_...``); a model
  that numbers its calls afresh each turn needs a new thread per turn.
- **The answer** is a ``ToolMessage``: the committed result's JSON with
  ``status="success"``; anything else with ``status="error"`` and the
  envelope's text (:func:`~toolq.integrations.common.model_text`), which says
  what to do: the fields to fix, that toolq retries or verifies the call and
  the model must not repeat it, that it failed. The envelope, as a dict, is
  the message's ``artifact`` (kept in the graph's state, not sent to the model).
  The tool never raises for an outcome, so no LangChain retry middleware ever
  repeats a write: toolq's scheduler retries, its verifier settles unknowns.
- **A call that outlasts** ``wait`` answers OPERATION_PENDING with its ref; the
  model follows it with the ``toolq_get_operation`` tool that :func:`tools` adds.
- **Approval**: inside a LangGraph run on a thread (``thread_id``; a
  checkpointer is needed to resume), a call toolq holds for approval pauses
  the graph with :func:`langgraph.types.interrupt`.
  The interrupt's value has the shape of the human-in-the-loop middleware's
  per-call request (``type="tool_approval"``, ``tool_call_id``, ``name``,
  ``args``, ``description``) plus ``operation_ref``; resume with
  ``Command(resume={"type": "approve"})`` or ``{"type": "reject", "message": ...}``
  (keyed by interrupt id when several calls paused at once; answers are
  validated: a bad one can be given again). The decision is forwarded to toolq
  (``approve`` / ``cancel``, recorded as ``langgraph:approve`` / ``langgraph:reject``;
  docs/integrations.md, "Approval: one rule") and the write runs once, under the same ref. The
  operation waits in toolq meanwhile, so an operator may decide first (console,
  CLI, API): the resumed call then answers with what happened (a rejection after
  an operator's approval reads the write's outcome, without the reviewer's note). Outside a graph,
  or in one run without a thread (it could never be resumed), the model is told
  approval is requested, and an operator decides.
- **Traces** (docs/integrations.md, "Traces"): a call's toolq spans are
  children of the OpenTelemetry span current in the tool, which is the tool
  run's own when an OpenTelemetry callback handler makes it current (as
  Langfuse's does), and the submit span carries the tool run's id
  (``langchain.run_id``, as LangSmith and callbacks know the run).
- **Sync** ``invoke`` runs the async path on a private event loop when none is
  running in the calling thread (LangGraph's sync executor threads); under a
  running loop it refuses (``RuntimeError``) rather than block it: use
  ``ainvoke`` / ``astream``.

Tested with langchain-core 1.8, langgraph 1.2 and langchain 1.5 (``create_agent``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, NotRequired

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langgraph.runtime import get_runtime
from langgraph.types import interrupt
from pydantic import PrivateAttr
from typing_extensions import TypedDict

from toolq.client.queue import ToolQueue
from toolq.core.envelope import AnyEnvelope, ToolError, to_dict
from toolq.core.redact import scrub
from toolq.integrations.common import (
    DEFAULT_WAIT,
    FOLLOW_DESCRIPTION,
    FOLLOW_TOOL,
    Kind,
    describe,
    follow,
    follow_schema,
    kind_of,
    output_text,
    resolve_approval,
    run,
    stable_ref,
    tool_names,
)
from toolq.process import tracing

__all__ = ["Decision", "ToolqTool", "follow_tool", "tool", "tools"]

#: Who a decision taken through an interrupt is recorded as, in toolq's history.
DECIDED_BY = "langgraph"
#: The longest reviewer's note passed on to the model.
NOTE_MAX = 200


class Decision(TypedDict):
    """A reviewer's answer to a toolq approval interrupt (``Command(resume=...)``),
    as the human-in-the-loop middleware's approve and reject decisions."""

    type: Literal["approve", "reject"]
    message: NotRequired[str]


@dataclass(frozen=True)
class _Call:
    """What LangChain knows of the call being run: the model's call id, the config."""

    tool_call_id: str | None
    config: RunnableConfig


# The call of the running tool, for _arun: BaseTool hands _arun only the arguments
# (a tool argument named like LangChain's own could not share that namespace).
_CALL: ContextVar[_Call | None] = ContextVar("toolq_langchain_call", default=None)


@contextmanager
def _calling(tool_call_id: str | None, config: RunnableConfig | None) -> Iterator[None]:
    """:data:`_CALL` set to this call while the tool runs."""
    token = _CALL.set(_Call(tool_call_id, config or {}))
    try:
        yield
    finally:
        _CALL.reset(token)


class _ToolqBase(BaseTool):
    """What both toolq tools share: the call's id and config, the answer as a ToolMessage."""

    wait: float = DEFAULT_WAIT
    _tq: ToolQueue = PrivateAttr()

    def __init__(self, *, tq: ToolQueue, **fields: Any) -> None:
        super().__init__(**fields)
        self._tq = tq

    async def arun(
        self,
        tool_input: str | dict[str, Any],
        *args: Any,
        tool_call_id: str | None = None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        with _calling(tool_call_id, config):
            return await super().arun(
                tool_input, *args, tool_call_id=tool_call_id, config=config, **kwargs
            )

    def run(
        self,
        tool_input: str | dict[str, Any],
        *args: Any,
        tool_call_id: str | None = None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        with _calling(tool_call_id, config):
            return super().run(
                tool_input, *args, tool_call_id=tool_call_id, config=config, **kwargs
            )

    def _run(self, /, *args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # No loop in this thread (LangGraph's sync executor): a private one. It
            # copies this context, so _arun still sees the call.
            return asyncio.run(self._arun(*args, **kwargs))
        raise RuntimeError(
            f"toolq tool {self.name!r} was invoked synchronously inside a running event "
            "loop; use ainvoke/astream (waiting here would block the loop)"
        )

    def _answer(self, envelope: AnyEnvelope, call: _Call, note: str = "") -> ToolMessage | str:
        text = output_text(envelope)
        if note:
            text = f"{note}\n{text}"
        if call.tool_call_id is None:
            return text
        return ToolMessage(
            content=text,
            artifact=to_dict(envelope),
            tool_call_id=call.tool_call_id,
            name=self.name,
            status="success" if envelope.ok else "error",
        )


class ToolqTool(_ToolqBase):
    """One registered toolq tool; built by :func:`tool`. See the module docstring."""

    async def _arun(self, /, **args: Any) -> ToolMessage | str:
        call = _CALL.get() or _Call(None, {})
        tq = self._tq
        ref = stable_ref(
            call.tool_call_id, scope=_thread_id(call.config), limits=tq.settings.limits
        )
        if ref is None:
            raise ValueError(
                f"invoke toolq tool {self.name!r} with a ToolCall ({{'type': 'tool_call', "
                "'id': ..., 'name': ..., 'args': {...}}): its id keys the operation"
            )
        with tracing.caller(_run_of()):
            env = await run(tq, self.name, args, ref=ref, call_id=call.tool_call_id, wait=self.wait)
        if kind_of(env) is not Kind.APPROVAL or not _can_pause() or not isinstance(env, ToolError):
            return self._answer(env, call)
        request = {
            "type": "tool_approval",
            "tool_call_id": call.tool_call_id,
            "name": self.name,
            "args": args,
            "description": env.user_message,
            "operation_ref": ref,
        }
        # The first time, this raises GraphInterrupt; on resume LangGraph runs the
        # tool again from the top (run() returns the same operation) and this returns.
        decision = interrupt(request, response_schema=Decision)
        approved = decision["type"] == "approve"
        env = await resolve_approval(
            tq, ref, approved, wait=self.wait, by=DECIDED_BY, call_id=call.tool_call_id
        )
        # The reviewer's reason only when the rejection is what happened: a rejection
        # that came after an operator's approval is answered with the outcome alone.
        cancelled = isinstance(env, ToolError) and env.code == "OPERATION_CANCELLED"
        return self._answer(env, call, _note(decision) if cancelled else "")


class _FollowTool(_ToolqBase):
    """:data:`~toolq.integrations.common.FOLLOW_TOOL`: a pending operation, by its ref."""

    async def _arun(self, /, **args: Any) -> ToolMessage | str:
        call = _CALL.get() or _Call(None, {})
        ref = args.get("operation_ref")
        env = await follow(self._tq, ref, wait=self.wait, call_id=call.tool_call_id)
        return self._answer(env, call)


def tool(tq: ToolQueue, name: str, *, wait: float = DEFAULT_WAIT, **options: Any) -> ToolqTool:
    """The LangChain tool for toolq tool ``name`` (``errors.UnknownTool`` if none).

    ``wait``: seconds a call waits for its operation before it answers
    OPERATION_PENDING. ``options``: other ``BaseTool`` fields (``tags``,
    ``metadata``, ``return_direct``, ``callbacks``, ...). The model sees the
    tool's registered JSON Schema; toolq validates the arguments.
    """
    description, schema = describe(tq, name)
    return ToolqTool(
        tq=tq, name=name, description=description, args_schema=schema, wait=wait, **options
    )


def follow_tool(tq: ToolQueue, *, wait: float = DEFAULT_WAIT, **options: Any) -> BaseTool:
    """The ``toolq_get_operation`` tool: follow a pending operation by its ref."""
    schema = follow_schema(tq.settings.limits)
    return _FollowTool(
        tq=tq,
        name=FOLLOW_TOOL,
        description=FOLLOW_DESCRIPTION,
        args_schema=schema,
        wait=wait,
        **options,
    )


def tools(tq: ToolQueue, *, wait: float = DEFAULT_WAIT, **options: Any) -> list[BaseTool]:
    """Every registered toolq tool, then :func:`follow_tool`; ``options`` as :func:`tool`."""
    made: list[BaseTool] = [tool(tq, n, wait=wait, **options) for n in tool_names(tq)]
    return [*made, follow_tool(tq, wait=wait, **options)]


def _can_pause() -> bool:
    """Whether this call runs in a LangGraph run that can be resumed: a graph's task
    (its runtime is set) on a thread. Without a thread there is no checkpointer (one
    refuses to run without a thread), so an interrupt could never be answered."""
    try:
        runtime = get_runtime()
    except RuntimeError:  # not even in a runnable's context
        return False
    info = runtime.execution_info if runtime is not None else None
    return info is not None and info.thread_id is not None


def _run_of() -> dict[str, str]:
    """The tool run's id, for the submit span: the parent run of the callbacks LangChain
    hands the running tool's children (its config in this context)."""
    if not tracing.enabled():
        return {}
    callbacks = ensure_config().get("callbacks")
    run_id = getattr(callbacks, "parent_run_id", None)
    return {"langchain.run_id": str(run_id)} if run_id is not None else {}


def _thread_id(config: RunnableConfig) -> str | None:
    thread = config.get("configurable", {}).get("thread_id")
    return str(thread) if thread is not None and str(thread) else None


def _note(decision: Decision) -> str:
    """The reviewer's reason for a rejection, as one scrubbed line for the model."""
    message = decision.get("message")
    if decision["type"] != "reject" or not isinstance(message, str) or not message.strip():
        return ""
    return f"A reviewer rejected this call: {scrub(message)[:NOTE_MAX]}"
