"""toolq tools for the Anthropic SDK's tool runner (``pip install 'toolq[anthropic]'``;
anthropic 2.14 tested).

    from anthropic import AsyncAnthropic
    from toolq.integrations import anthropic as toolq_anthropic

    runner = AsyncAnthropic().beta.messages.tool_runner(
        model="claude-sonnet-4-5", max_tokens=1024, messages=[...],
        tools=toolq_anthropic.tools(tq),
    )
    async for message in runner: ...

:func:`tool` returns an async beta tool (a ``BetaAsyncBuiltinFunctionTool``:
the tool runner awaits its ``call``) for one registered toolq tool, with the
input schema of its argument model; :func:`tools` returns one per tool plus
``toolq_get_operation`` (:func:`follow_tool`), which the model uses to follow
a call that was still pending. A call is submitted on ``tq.aio`` and waits up
to ``wait`` seconds on the operation's notice (no thread, no polling).

What the model gets back (:mod:`toolq.integrations.common` kinds): a result as
its JSON; anything else as an ``is_error`` tool result whose content is the
envelope's ``agent_message`` and JSON (as :func:`toolq.core.render.to_anthropic_tool_result`,
with the fields to fix named for invalid input). A call still running, rate
limited or being verified carries its ``operation_ref`` and "follow it with
toolq_get_operation, do not call the tool again": toolq's scheduler retries
and verifies; the runner never retries a tool. No exception or upstream text
reaches the model.

**The ref.** ``operation_ref`` is the ``tool_use`` block's id (``toolu_…``,
unique per call from the API), prefixed by ``scope`` when given (the Messages
API has no conversation id: pass yours when ids can repeat, e.g. from a
scripted model). A conversation replayed with the same assistant message
sends the same ids, so a replayed call reaches the same operation.

The tool runner passes a tool only the call's input (anthropic 2.14:
``BaseAsyncToolRunner._run_tool(tool, tool_use)`` awaits
``tool.call(tool_use.input)``), so the tool reads the ``tool_use`` block from
that caller's frame and keeps it only when its ``input`` is the very object it
was given (:func:`calling_tool_use`). Called any other way, it refuses (an
``INTERNAL_ERROR`` result and a log line) rather than mint a fresh ref: in a
loop of your own, answer each ``tool_use`` block with :func:`answer`. The
managed-agents ``SessionToolRunner`` is such a caller (it passes a copy of the
input): there too the tool refuses.

**Approval.** The runner has no pause of its own: a tool that requires approval
answers ``MISSING_APPROVAL`` (``is_error``, with its ref) and the operation
waits in toolq. Approve it there (:func:`decide`, ``tq.aio.approve``, the
console or ``toolq approve``), then let the model follow the ref with
``toolq_get_operation``: the write runs once. :func:`decide` with
``approved=False`` cancels it (recorded as ``anthropic:approve`` /
``anthropic:reject``; docs/integrations.md, "Approval: one rule").
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from anthropic.lib.tools import BetaAsyncBuiltinFunctionTool, ToolError
from anthropic.types.beta import BetaToolParam

from toolq.core.envelope import AnyEnvelope
from toolq.integrations import common
from toolq.integrations.common import DEFAULT_WAIT, FOLLOW_TOOL, model_text, output_text

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

log = logging.getLogger("toolq.integrations.anthropic")

#: What toolq records as the approver or canceller in :func:`decide`.
BY = "anthropic"
#: How many callers up :func:`calling_tool_use` looks for the runner's frame.
_FRAMES = 4
_KEYS = ("id", "name", "input")

__all__ = ["ToolqTool", "answer", "calling_tool_use", "decide", "follow_tool", "tool", "tools"]


class ToolqTool(BetaAsyncBuiltinFunctionTool):
    """One toolq tool (or ``toolq_get_operation``) as an async beta tool."""

    def __init__(
        self,
        tq: ToolQueue,
        name: str,
        *,
        description: str,
        input_schema: dict[str, Any],
        wait: float,
        scope: str | None,
    ) -> None:
        self.tq, self.tool_name, self.wait, self.scope = tq, name, wait, scope
        self._definition: BetaToolParam = {
            "name": name,
            "description": description,
            "input_schema": cast(Any, input_schema),
        }

    def __repr__(self) -> str:
        return f"<ToolqTool {self.tool_name}>"

    def to_dict(self) -> BetaToolParam:
        return self._definition

    async def call(self, input: object) -> str:
        """The tool's answer to the runner's call: the result's JSON; ``ToolError``
        (an ``is_error`` result carrying the envelope) for anything else."""
        tool_use = calling_tool_use(input)
        if tool_use is None:
            log.error(
                "toolq tool %s was called without a tool_use id (not by the SDK's tool "
                "runner): refused, since a fresh ref would make a retry a second write",
                self.tool_name,
            )
            failed = common.unexpected_envelope("none", None, None, may_have_submitted=False)
            raise ToolError(model_text(failed))
        env = await self.envelope(tool_use[0], input)
        if not env.ok:
            raise ToolError(model_text(env))
        return output_text(env)

    async def envelope(self, tool_use_id: str, input: object) -> AnyEnvelope:
        """Run the call ``tool_use_id`` asked for: its envelope (never raises for the model)."""
        return await _envelope(self.tq, self.tool_name, tool_use_id, input, self.wait, self.scope)


def tool(
    tq: ToolQueue,
    name: str,
    *,
    wait: float = DEFAULT_WAIT,
    scope: str | None = None,
    description: str | None = None,
) -> ToolqTool:
    """An async beta tool for the registered toolq tool ``name``; ``errors.UnknownTool``
    if there is none. ``wait``: seconds before a call answers PENDING (with its ref)."""
    text, schema = common.describe(tq, name)
    return ToolqTool(
        tq, name, description=description or text, input_schema=schema, wait=wait, scope=scope
    )


def follow_tool(tq: ToolQueue, *, wait: float = DEFAULT_WAIT) -> ToolqTool:
    """``toolq_get_operation``: the model follows a pending call by its ``operation_ref``."""
    schema = common.follow_schema(tq.settings.limits)
    return ToolqTool(
        tq,
        FOLLOW_TOOL,
        description=common.FOLLOW_DESCRIPTION,
        input_schema=schema,
        wait=wait,
        scope=None,
    )


def tools(
    tq: ToolQueue, *, wait: float = DEFAULT_WAIT, scope: str | None = None, follow: bool = True
) -> list[ToolqTool]:
    """One tool per registered toolq tool, and ``toolq_get_operation`` unless ``follow=False``."""
    made = [tool(tq, name, wait=wait, scope=scope) for name in common.tool_names(tq)]
    return [*made, follow_tool(tq, wait=wait)] if follow else made


async def answer(
    tq: ToolQueue, tool_use: Any, *, wait: float = DEFAULT_WAIT, scope: str | None = None
) -> dict[str, Any]:
    """The ``tool_result`` block for one ``tool_use`` block (or dict), for a loop of your
    own: ``is_error`` unless the call committed. An unknown tool name is answered too."""
    block: Mapping[str, Any] = (
        tool_use
        if isinstance(tool_use, Mapping)
        else {k: getattr(tool_use, k, None) for k in _KEYS}
    )
    tool_use_id, name, input = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise ValueError("a tool_use block needs its id")
    env = await _envelope(tq, str(name), tool_use_id, input, wait, scope)
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": output_text(env),
        "is_error": not env.ok,
    }


async def decide(
    tq: ToolQueue, operation_ref: str, approved: bool, *, wait: float = DEFAULT_WAIT
) -> AnyEnvelope:
    """A person's decision on a call that answered ``MISSING_APPROVAL``: approve (the write
    runs once) or cancel it in toolq; then the operation's envelope, as the model will
    read it when it follows the ref."""
    return await common.resolve_approval(tq, operation_ref, approved, wait=wait, by=BY)


async def _envelope(
    tq: ToolQueue, name: str, tool_use_id: str, input: object, wait: float, scope: str | None
) -> AnyEnvelope:
    if name == FOLLOW_TOOL:
        ref = input.get("operation_ref") if isinstance(input, Mapping) else None
        return await common.follow(tq, ref, wait=wait, call_id=tool_use_id)
    ref = common.stable_ref(tool_use_id, scope=scope, limits=tq.settings.limits)
    if ref is None:  # pragma: no cover - the callers pass a non-empty id
        return common.unexpected_envelope("none", name, None, may_have_submitted=False)
    return await common.run(tq, name, input, ref=ref, call_id=tool_use_id, wait=wait)


def calling_tool_use(input: object) -> tuple[str, str] | None:
    """``(id, name)`` of the ``tool_use`` block the runner is answering with ``input``.

    Looks at the callers' frames for a ``tool_use`` local whose ``input`` is
    ``input`` itself (identity, so that two calls with equal inputs are never
    mixed up); None if there is none.
    """
    frame = sys._getframe(1)
    for _ in range(_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        block = frame.f_locals.get("tool_use")
        if block is not None and getattr(block, "input", None) is input:
            tool_use_id, name = getattr(block, "id", None), getattr(block, "name", None)
            if isinstance(tool_use_id, str) and tool_use_id and isinstance(name, str):
                return tool_use_id, name
    return None
