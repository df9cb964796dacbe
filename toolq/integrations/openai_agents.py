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

**Approval** (docs/integrations.md, "Approval: one rule"). A toolq tool with
``requires_approval=True`` gets the SDK's ``needs_approval``, which first
submits the call to toolq (the same ref and call id, the model's arguments):
the operation waits there, ``awaiting_approval``, listed in the console with
its arguments, while the run stops with an interruption. Whichever decides
first is applied once, in toolq:

- ``state.approve(item)`` and resuming: the tool forwards the approval
  (``tq.aio.approve``, recorded as ``openai-agents:approve``); the write runs once.
- ``state.reject(item)``: the SDK never calls a rejected tool, so call
  :func:`forward_decisions` before resuming; it cancels the operation in toolq
  (``openai-agents:reject``; nothing is written). Without it the operation
  stays ``awaiting_approval`` until toolq's ``approval_timeout`` escalates it
  (nothing is written, unless an operator approves it meanwhile).
- An operator (console, ``toolq approve``/``cancel``, the API) may decide
  while the run is paused: the resumed call then answers with what happened
  (the result; or OPERATION_CANCELLED), never a second write. A rejection that
  comes after an operator's approval cannot undo the write:
  :func:`forward_decisions` turns it into an approval in the state, so the
  model reads the outcome rather than "not approved".

A call whose operation is already past approval (a replay) is not asked again.
A call whose arguments toolq refuses is not asked either: it answers with the
fields to fix. A tool that asks for approval from inside (``raise
errors.NeedsApproval``) is answered with the envelope: an operator approves it
in toolq, the model follows the ref.

**Traces** (docs/integrations.md, "Traces"). The SDK traces with its own
tracing, not OpenTelemetry. A call's toolq spans are children of the
OpenTelemetry span current in the tool: the function span itself when a
bridge makes it current (Logfire's ``instrument_openai_agents``, OpenInference's
``OpenAIAgentsInstrumentor``: Phoenix, Langfuse, Arize), else your own span
around the run. With none current, their parent is the function span's ids
(the agents trace id as the trace id: one agent run's calls are one trace,
found under the id the SDK's dashboard shows). Either way the submit span
carries ``openai_agents.trace_id`` and ``openai_agents.span_id``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from agents import FunctionTool, RunContextWrapper
from agents.exceptions import UserError
from agents.run_state import RunState
from agents.strict_schema import ensure_strict_json_schema
from agents.tool_context import ToolContext
from agents.tracing import get_current_span
from agents.tracing.spans import NoOpSpan

from toolq.core import errors
from toolq.core.states import State
from toolq.integrations import common
from toolq.integrations.common import DEFAULT_WAIT, FOLLOW_TOOL, Kind, kind_of, output_text
from toolq.process import tracing

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

#: A scope: a fixed string, or read from the run context for each call.
Scope = str | Callable[[RunContextWrapper[Any]], str | None] | None

#: What toolq records as the approver (``:approve``) or canceller (``:reject``) of a
#: call the SDK's run decided.
BY = "openai-agents"

_HEX = frozenset("0123456789abcdef")

__all__ = ["Scope", "follow_tool", "forward_decisions", "tool", "tools"]


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
        with _traced():
            env = await common.run(
                tq, name, _arguments(raw), ref=ref, call_id=ctx.tool_call_id, wait=wait
            )
        if kind_of(env) is Kind.APPROVAL and ctx.is_tool_approved(name, ctx.tool_call_id):
            env = await common.resolve_approval(
                tq, ref, True, wait=wait, by=BY, call_id=ctx.tool_call_id
            )
        return output_text(env)

    async def needs_approval(
        ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
    ) -> bool:
        # Submit first, so the operation waits in toolq (and the console) while the SDK
        # asks; the same ref again returns the operation as it is. Ask unless toolq has
        # it past its approval (a replayed step, or an operator decided); not when toolq
        # refuses the arguments (the tool then answers with the fields to fix); ask too
        # when toolq cannot tell (the cautious answer: the tool submits on approval).
        try:
            with _traced():
                sub = await tq.aio.submit(
                    name, params, operation_ref=ref_of(ctx, call_id), call_id=call_id
                )
        except (errors.InvalidArguments, errors.IdempotencyKeyReused):
            return False
        except errors.RequestRefused:
            return True
        return sub.state is State.AWAITING_APPROVAL

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


async def forward_decisions(
    tq: ToolQueue, state: RunState[Any, Any], *, scope: Scope = None
) -> None:
    """Apply in toolq the decisions recorded on ``state`` for its pending toolq calls;
    call it after ``state.approve``/``state.reject`` and before resuming the run.

    A rejected call is cancelled (``openai-agents:reject``): the SDK never calls
    it, so toolq would hear of it only when its ``approval_timeout`` escalates.
    An approved one is approved (``openai-agents:approve``; resuming would too).
    A decision toolq already took (an operator, or a repeated call) stays as it
    is; a rejection of a call toolq already approved becomes an approval on
    ``state``, so that the resumed run reads what happened instead of "not
    approved". ``scope``: as given to :func:`tool`. Calls without a decision, and
    tools that are not toolq's, are left alone.
    """
    ctx = state._context  # the SDK keeps the decisions there; no public accessor in 0.24
    if ctx is None:
        return
    limits = tq.settings.limits
    for item in state.get_interruptions():
        name, call_id = item.tool_name, item.call_id
        if name is None or call_id is None or name not in tq.app.registry:
            continue
        decision = ctx.is_tool_approved(name, call_id)
        ref = common.stable_ref(call_id, scope=_scope(scope, ctx), limits=limits)
        if decision is None or ref is None:
            continue
        try:
            if decision:
                await tq.aio.approve(ref, by=f"{BY}:approve")
            else:
                await tq.aio.cancel(ref, by=f"{BY}:reject")
        except errors.InvalidState:
            rec = await tq.aio.get(ref)
            if not decision and rec is not None and rec.approved:
                state.approve(item)  # toolq approved it first: the write is not undone
        except errors.OperationNotFound:
            continue  # never submitted (toolq was away): the SDK's decision is the only one


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


def _traced() -> AbstractContextManager[None]:
    """The SDK's current span (the function span, in a tool) as toolq's caller: its ids
    on the submit span, and its parent when no OpenTelemetry span is current."""
    span = get_current_span()
    if span is None or isinstance(span, NoOpSpan):  # the SDK's tracing is off
        return nullcontext()
    attrs = {"openai_agents.trace_id": span.trace_id, "openai_agents.span_id": span.span_id}
    return tracing.caller(attrs, parent=otel_ids(span.trace_id, span.span_id))


def otel_ids(trace_id: str, span_id: str) -> tuple[int, int] | None:
    """An agents trace and span id (``trace_<32 hex>``, ``span_<24 hex>``) as an
    OpenTelemetry trace id and span id (its first 16 hex digits); None for ids of
    another shape (a no-op span's, or custom ids)."""
    head, _, trace_hex = trace_id.partition("_")
    kind, _, span_hex = span_id.partition("_")
    digits = trace_hex + span_hex[:16]
    if head != "trace" or kind != "span" or len(digits) != 48 or not set(digits) <= _HEX:
        return None
    ids = int(trace_hex, 16), int(span_hex[:16], 16)
    return ids if all(ids) else None


def _scope(scope: Scope, ctx: RunContextWrapper[Any]) -> str | None:
    return scope(ctx) if callable(scope) else scope


def _strict(schema: dict[str, Any]) -> bool:
    """Whether the SDK can make ``schema`` strict (an open object cannot be)."""
    try:
        ensure_strict_json_schema(json.loads(json.dumps(schema)))
    except (UserError, ValueError, TypeError):
        return False
    return True
