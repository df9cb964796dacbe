"""toolq tools for the OpenAI Agents SDK (``pip install 'toolq[openai-agents]'``; 0.24 tested).

    from agents import Agent, Runner
    from toolq.integrations import openai_agents

    agent = Agent(name="billing", tools=openai_agents.tools(tq))
    result = await Runner.run(agent, "Invoice cus_1234 for 12 EUR")

:func:`tool` returns a ``FunctionTool`` for one registered toolq tool
(``params_json_schema`` from its argument model, strict when the SDK can make
it so); :func:`tools` returns one per tool plus ``toolq_get_operation``
(:func:`follow_tool`), which the model uses to follow a call that was still
pending. ``on_invoke_tool`` is async: it submits the call on ``tq.aio`` and
waits up to ``wait`` seconds on the operation's notice (no thread, no polling).

What the model gets back (:mod:`toolq.integrations.common` kinds):

- a result: the tool's result as JSON;
- anything else: the envelope's ``agent_message`` and JSON, as the tool's
  output string (the SDK's way to tell the model of a failure): fields to fix
  for invalid arguments; for a call still running, rate limited or being
  verified, its ``operation_ref`` and "follow it with toolq_get_operation, do
  not call the tool again" (toolq's scheduler retries and verifies; the SDK
  never retries a tool). No exception text or upstream text reaches it.

**The ref.** ``operation_ref`` is the model's tool-call id
(``ToolContext.tool_call_id``, ``call_…`` from OpenAI's API, unique per call),
prefixed by ``scope`` when given. It is stable because the SDK keeps the
model's response in the ``RunState``: a run resumed after an interruption, or
a step replayed from a saved state, invokes the same call id, which reaches the
same toolq operation (one side effect). The SDK gives tools no run or
conversation id, so pass ``scope`` (a string, or a function of the
``RunContextWrapper``, e.g. ``lambda ctx: ctx.context.conversation_id``) when
call ids can repeat between runs (models that number their calls, scripted
models).

**Approval.** A toolq tool with ``requires_approval=True`` gets the SDK's
``needs_approval``: the run stops with an interruption before anything is
submitted. ``state.approve(item)`` and resuming the run submits the call and
forwards the decision to toolq (``tq.aio.approve``, recorded as
``openai-agents:approve``), so the write runs once; ``state.reject(item)``
sends the model the SDK's rejection and nothing reaches toolq. A call whose
operation is already past approval (a replay) is not asked again. A tool that
asks for approval from inside (``raise errors.NeedsApproval``) is answered with
the envelope: an operator approves it in toolq, the model follows the ref.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agents import FunctionTool, RunContextWrapper
from agents.exceptions import UserError
from agents.strict_schema import ensure_strict_json_schema
from agents.tool_context import ToolContext

from toolq.core import errors
from toolq.core.states import State
from toolq.integrations import common
from toolq.integrations.common import DEFAULT_WAIT, FOLLOW_TOOL, Kind, kind_of, output_text

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

#: A scope: a fixed string, or read from the run context for each call.
Scope = str | Callable[[RunContextWrapper[Any]], str | None] | None

#: What toolq records as the approver of a call the SDK's run approved.
BY = "openai-agents"

__all__ = ["Scope", "follow_tool", "tool", "tools"]


def tool(
    tq: ToolQueue,
    name: str,
    *,
    wait: float = DEFAULT_WAIT,
    scope: Scope = None,
    strict: bool | None = None,
    description: str | None = None,
) -> FunctionTool:
    """A ``FunctionTool`` for the registered toolq tool ``name``.

    ``wait``: seconds a call waits before it answers PENDING (with its ref).
    ``scope``: prefixes the call id in the ref (see the module docstring).
    ``strict``: the SDK's strict JSON schema; ``None`` makes it strict when the
    argument model can be (no open objects), else not. ``errors.UnknownTool``
    if there is no such tool.
    """
    text, schema = common.describe(tq, name)
    requires_approval = tq.app.registry.get(name).options.requires_approval
    limits = tq.settings.limits

    def ref_of(ctx: RunContextWrapper[Any], call_id: str) -> str:
        ref = common.stable_ref(call_id, scope=_scope(scope, ctx), limits=limits)
        if ref is None:  # the SDK always passes one; a missing one is a bug, not the model's
            raise UserError(f"tool {name}: the tool call has no id to make its operation_ref")
        return ref

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        ref = ref_of(ctx, ctx.tool_call_id)
        env = await common.run(
            tq, name, _arguments(raw), ref=ref, call_id=ctx.tool_call_id, wait=wait
        )
        if kind_of(env) is Kind.APPROVAL and ctx.is_tool_approved(name, ctx.tool_call_id):
            env = await common.resolve_approval(
                tq, ref, True, wait=wait, by=BY, call_id=ctx.tool_call_id
            )
        return output_text(env)

    async def needs_approval(
        ctx: RunContextWrapper[Any], _params: dict[str, Any], call_id: str
    ) -> bool:
        # Ask unless toolq already has this call past its approval (a replayed step);
        # ask too when toolq cannot tell (the cautious answer).
        try:
            rec = await tq.aio.get(ref_of(ctx, call_id))
        except errors.RequestRefused:
            return True
        return rec is None or rec.state is State.AWAITING_APPROVAL

    return FunctionTool(
        name=name,
        description=description or text,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=_strict(schema) if strict is None else strict,
        needs_approval=needs_approval if requires_approval else False,
    )


def follow_tool(tq: ToolQueue, *, wait: float = DEFAULT_WAIT) -> FunctionTool:
    """``toolq_get_operation``: the model follows a pending call by its ``operation_ref``."""

    async def invoke(ctx: ToolContext[Any], raw: str) -> str:
        args = _arguments(raw)
        ref = args.get("operation_ref") if isinstance(args, dict) else None
        return output_text(await common.follow(tq, ref, wait=wait, call_id=ctx.tool_call_id))

    return FunctionTool(
        name=FOLLOW_TOOL,
        description=common.FOLLOW_DESCRIPTION,
        params_json_schema=common.follow_schema(tq.settings.limits),
        on_invoke_tool=invoke,
        strict_json_schema=True,
    )


def tools(
    tq: ToolQueue, *, wait: float = DEFAULT_WAIT, scope: Scope = None, follow: bool = True
) -> list[FunctionTool]:
    """One ``FunctionTool`` per registered toolq tool, and ``toolq_get_operation``
    unless ``follow=False``."""
    made = [tool(tq, name, wait=wait, scope=scope) for name in common.tool_names(tq)]
    return [*made, follow_tool(tq, wait=wait)] if follow else made


def _arguments(raw: str) -> Any:
    """The model's arguments; text that is not JSON is passed on to be refused as such."""
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


def _scope(scope: Scope, ctx: RunContextWrapper[Any]) -> str | None:
    return scope(ctx) if callable(scope) else scope


def _strict(schema: dict[str, Any]) -> bool:
    """Whether the SDK can make ``schema`` strict (an open object cannot be)."""
    try:
        ensure_strict_json_schema(json.loads(json.dumps(schema)))
    except (UserError, ValueError, TypeError):
        return False
    return True
