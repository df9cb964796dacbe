"""Pydantic AI: each toolq tool as a pydantic-ai ``Tool``, all of them as a toolset.

    from pydantic_ai import Agent
    from pydantic_ai.tools import DeferredToolRequests
    from toolq.integrations import pydantic_ai as toolq_pydantic_ai

    agent = Agent(model, toolsets=[toolq_pydantic_ai.toolset(tq)],
                  output_type=[str, DeferredToolRequests])
    result = await agent.run("Pay Bob 50 EUR")
    while isinstance(result.output, DeferredToolRequests):   # paused: approval, pending
        requests = result.output
        decided = {c.tool_call_id: ask_a_person(c) for c in requests.approvals}
        results = requests.build_results(approvals=decided)
        results.update(await toolq_pydantic_ai.deferred_results(tq, requests))
        await toolq_pydantic_ai.forward_decisions(tq, requests, results)
        result = await agent.run(message_history=result.all_messages(),
                                 deferred_tool_results=results)

What an envelope becomes (:mod:`toolq.integrations.common` kinds):

- a result: the tool's return value (``ToolReturn``: the result for the model,
  the envelope as a dict in ``metadata``, which the model does not see);
- fix your input: ``ModelRetry`` with the envelope's text, naming the fields
  (it counts against the tool's ``max_retries``, as any retry does);
- approval: ``ApprovalRequired``, the run ends with ``DeferredToolRequests``
  (``metadata[tool_call_id]["operation_ref"]``). On resume an approved call is
  run again with ``ctx.tool_call_approved``: the decision goes to toolq
  (``tq.aio.approve``, recorded as ``pydantic-ai:approve``) and the write runs
  once. Pydantic AI never runs a denied call, so pass the results to
  :func:`forward_decisions` to cancel it in toolq (``pydantic-ai:reject``; else
  toolq's ``approval_timeout`` escalates it; nothing is written either way). The
  operation waits in toolq (``awaiting_approval``, in the console) from the
  pause on, so an operator may decide first: the resumed call answers with what
  happened, and a denial after an operator's approval becomes an approval (the
  write is not undone; docs/integrations.md, "Approval: one rule"). An
  approval that edits the arguments (``override_args``) is refused by toolq,
  which binds an approval to the arguments it was asked for.
- still pending past ``wait`` (toolq retries a rate limit, verifies an
  unknown outcome, or the write is long): ``CallDeferred`` with its
  ``operation_ref``; :func:`deferred_results` waits for the operations and
  gives their outcomes to resume the run with (or resume with no results: the
  run calls the tool again under the same ref). With ``defer_pending=False``
  the model is told instead, and follows the ref with ``toolq_get_operation``.
- anything terminal: ``ToolFailed`` with the envelope's text (the model adapts;
  no retry budget used). No exception or upstream text reaches the model.

Nothing here has pydantic-ai retry a write: a tool ``timeout`` is refused
(a timed-out call would come back as a new call id, a new write); toolq bounds
the wait itself.

**The ref** is ``<conversation_id>/<tool_call_id>``
(:func:`~toolq.integrations.common.stable_ref`). The tool-call id comes from
the model's response, which the message history keeps; ``RunContext.conversation_id``
is carried by the history too, so a run resumed with ``message_history`` (and
``deferred_tool_results``) reaches the same operations. A run started without
history gets a fresh conversation id: to continue a conversation from stored
messages of your own, pass ``conversation_id=`` to ``Agent.run``, or ``scope``
here (a string, or a function of the ``RunContext``).

Tested with pydantic-ai-slim 2.68.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    FunctionToolset,
    ModelRetry,
    RunContext,
    Tool,
    ToolFailed,
    ToolReturn,
)
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved

from toolq.core import errors
from toolq.core.envelope import AnyEnvelope, ToolSuccess, to_dict
from toolq.integrations.common import (
    DEFAULT_WAIT,
    FOLLOW_DESCRIPTION,
    FOLLOW_TOOL,
    Kind,
    abandon,
    describe,
    follow,
    follow_schema,
    kind_of,
    model_text,
    resolve_approval,
    run,
    stable_ref,
    tool_names,
)

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

__all__ = [
    "Scope",
    "deferred_results",
    "follow_tool",
    "forward_decisions",
    "outcome",
    "tool",
    "tools",
    "toolset",
]

#: A scope for the ref: a fixed string, or read from each call's RunContext.
Scope = str | Callable[[RunContext[Any]], str | None] | None

#: Who toolq records as the approver of a call a pydantic-ai run approved.
BY = "pydantic-ai"

#: The ``metadata`` key a deferred toolq call carries its operation_ref under.
REF_KEY = "operation_ref"


def tool(
    tq: ToolQueue,
    name: str,
    *,
    wait: float = DEFAULT_WAIT,
    scope: Scope = None,
    defer_pending: bool = True,
    max_retries: int | None = None,
    strict: bool | None = None,
) -> Tool[Any]:
    """The pydantic-ai ``Tool`` for toolq tool ``name`` (``errors.UnknownTool`` if none).

    ``wait``: seconds a call waits for its operation before it is deferred
    (``defer_pending``) or answered as pending. ``scope``: the ref's prefix, the
    run's ``conversation_id`` when None. ``max_retries``: how many "fix your
    input" rounds the model gets (the agent's default when None). The model
    sees the tool's registered JSON Schema; toolq validates the arguments.
    """
    description, schema = describe(tq, name)
    limits = tq.settings.limits

    async def call(ctx: RunContext[Any], /, **args: Any) -> Any:
        ref = stable_ref(ctx.tool_call_id, scope=_scope(scope, ctx), limits=limits)
        if ref is None:  # pydantic-ai always passes one: a missing one is a bug, not the model's
            raise ValueError(f"tool {name}: the tool call has no id to make its operation_ref")
        env = await run(tq, name, args, ref=ref, call_id=ctx.tool_call_id, wait=wait)
        if kind_of(env) is Kind.APPROVAL:
            if not ctx.tool_call_approved:
                raise ApprovalRequired(metadata=_metadata(env))
            env = await resolve_approval(tq, ref, True, wait=wait, by=BY, call_id=ctx.tool_call_id)
        if defer_pending and kind_of(env) is Kind.PENDING:
            raise CallDeferred(metadata=_metadata(env))
        return outcome(env)

    made: Tool[Any] = Tool.from_schema(call, name, description, schema, takes_ctx=True)
    made.max_retries = max_retries
    made.strict = strict
    return made


def follow_tool(tq: ToolQueue, *, wait: float = DEFAULT_WAIT) -> Tool[Any]:
    """``toolq_get_operation``: the model follows a pending call by its ``operation_ref``."""

    async def call(ctx: RunContext[Any], /, **args: Any) -> Any:
        ref = args.get("operation_ref")
        return outcome(await follow(tq, ref, wait=wait, call_id=ctx.tool_call_id))

    schema = follow_schema(tq.settings.limits)
    return Tool.from_schema(call, FOLLOW_TOOL, FOLLOW_DESCRIPTION, schema, takes_ctx=True)


def tools(
    tq: ToolQueue,
    *,
    wait: float = DEFAULT_WAIT,
    scope: Scope = None,
    defer_pending: bool = True,
    max_retries: int | None = None,
) -> list[Tool[Any]]:
    """One ``Tool`` per registered toolq tool (as :func:`tool`), then :func:`follow_tool`."""
    made = [
        tool(tq, n, wait=wait, scope=scope, defer_pending=defer_pending, max_retries=max_retries)
        for n in tool_names(tq)
    ]
    return [*made, follow_tool(tq, wait=wait)]


def toolset(
    tq: ToolQueue,
    *,
    wait: float = DEFAULT_WAIT,
    scope: Scope = None,
    defer_pending: bool = True,
    **options: Any,
) -> FunctionToolset[Any]:
    """:func:`tools` as a ``FunctionToolset``; ``options`` go to ``FunctionToolset``
    (``max_retries``, ``id``, ``instructions``, ...). ``timeout`` is refused: see the
    module docstring."""
    if "timeout" in options:
        raise ValueError(
            "a toolq toolset takes no timeout: a timed-out call would be retried by the model "
            "under a new call id (a second write); use wait= (the call then defers)"
        )
    made = tools(tq, wait=wait, scope=scope, defer_pending=defer_pending)
    return FunctionToolset(made, **options)


def outcome(envelope: AnyEnvelope) -> Any:
    """What the model gets for an envelope: a ``ToolReturn``, or ``ModelRetry`` /
    ``ToolFailed`` raised. PENDING and APPROVAL are returned as text: the model
    follows the ref (the tools raise ``CallDeferred`` / ``ApprovalRequired``
    before they get here)."""
    meta = to_dict(envelope)
    if isinstance(envelope, ToolSuccess):
        return ToolReturn(return_value=envelope.result, metadata=meta)
    kind = kind_of(envelope)
    if kind is Kind.FIX_INPUT:
        raise ModelRetry(model_text(envelope))
    if kind is Kind.FAILED:
        raise ToolFailed(model_text(envelope))
    return ToolReturn(return_value=model_text(envelope), metadata=meta)


async def deferred_results(
    tq: ToolQueue, requests: DeferredToolRequests, *, wait: float = DEFAULT_WAIT
) -> DeferredToolResults:
    """Results for the toolq calls a run deferred while they were pending, to resume it with.

    Waits up to ``wait`` seconds for all of their operations at once. Each one
    gets what the tool would have answered (:func:`outcome`): a ``ToolReturn``,
    ``ModelRetry`` or ``ToolFailed``; one still pending gets the pending text
    (the model follows it with ``toolq_get_operation``); one the tool found
    invalid is cancelled, since the model's corrected call is a new operation.
    Other tools' deferred calls are left to the caller (``results.update(...)``
    merges them).
    """
    pending = [
        (c.tool_call_id, ref)
        for c in requests.calls
        if (ref := _ref_of(requests.metadata.get(c.tool_call_id))) is not None
    ]
    envs = await asyncio.gather(*(follow(tq, ref, wait=wait, call_id=i) for i, ref in pending))
    for env in envs:
        if kind_of(env) is Kind.FIX_INPUT:
            await abandon(tq, env.operation_ref)  # as common.run does
    return DeferredToolResults(
        calls={i: _as_result(env) for (i, _), env in zip(pending, envs, strict=True)}
    )


async def forward_decisions(
    tq: ToolQueue, requests: DeferredToolRequests, results: DeferredToolResults
) -> None:
    """Forward the approvals in ``results`` to toolq, for the calls toolq holds for
    approval: approve, or cancel a denied one (pydantic-ai never runs it, so toolq
    would hear of it otherwise only when its approval times out). An approval
    with ``override_args`` cancels the original: toolq binds an approval to the
    arguments it was asked for. A decision already taken (by an operator, or a
    call made twice) stays as it is; a denial of a call toolq already approved
    becomes an approval in ``results`` (the write is not undone), so the resumed
    run reads what happened instead of the denial."""
    for call in requests.approvals:
        ref = _ref_of(requests.metadata.get(call.tool_call_id))
        decision = results.approvals.get(call.tool_call_id)
        if ref is None or decision is None:
            continue
        approved = decision is True or (
            isinstance(decision, ToolApproved) and decision.override_args is None
        )
        try:
            if approved:
                await tq.aio.approve(ref, by=f"{BY}:approve")
            else:
                await tq.aio.cancel(ref, by=f"{BY}:reject")
        except errors.InvalidState:  # decided already
            rec = await tq.aio.get(ref)
            if not approved and rec is not None and rec.approved:
                results.approvals[call.tool_call_id] = True
        except errors.RequestRefused:  # gone, or toolq away: the framework's decision stands
            continue


def _as_result(envelope: AnyEnvelope) -> Any:
    try:
        return outcome(envelope)
    except (ModelRetry, ToolFailed) as exc:
        return exc


def _metadata(envelope: AnyEnvelope) -> dict[str, Any]:
    return {REF_KEY: envelope.operation_ref, "envelope": to_dict(envelope)}


def _ref_of(metadata: Mapping[str, Any] | None) -> str | None:
    ref = (metadata or {}).get(REF_KEY)
    return ref if isinstance(ref, str) else None


def _scope(scope: Scope, ctx: RunContext[Any]) -> str | None:
    if callable(scope):
        return scope(ctx)
    return scope if scope is not None else ctx.conversation_id
