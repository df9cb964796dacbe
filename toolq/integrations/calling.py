"""Calling toolq from a framework's tool: submit and wait a bounded time, follow a
pending operation, forward an approval. Every failure is answered as an envelope."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from toolq.client.aio import OnProgress
from toolq.core import errors
from toolq.core.envelope import AnyEnvelope, FieldError
from toolq.core.states import SETTLED
from toolq.integrations.answers import (
    FOLLOW_TOOL,
    Kind,
    kind_of,
    pending_envelope,
    refused_envelope,
    unavailable_envelope,
    unexpected_envelope,
)
from toolq.integrations.refs import call_id_of, stable_ref
from toolq.process.waiting import Outage, OutageLog

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

log = logging.getLogger("toolq.integrations")

#: Seconds a framework's tool call waits for its operation before it answers PENDING.
DEFAULT_WAIT = 20.0


# --------------------------------------------------------------------------- tools


def describe(tq: ToolQueue, name: str) -> tuple[str, dict[str, Any]]:
    """A registered tool's description and JSON Schema; ``errors.UnknownTool`` if none."""
    tool = tq.app.registry.get(name)
    return tool.options.description or f"Run the {name} tool.", tool.input_schema()


def tool_names(tq: ToolQueue) -> list[str]:
    """Every registered tool's name; ``ValueError`` if one is :data:`FOLLOW_TOOL`."""
    names = [t.name for t in tq.app.registry]
    if FOLLOW_TOOL in names:
        raise ValueError(f"tool {FOLLOW_TOOL!r} clashes with the adapters' own follow tool")
    return names


def writes(tq: ToolQueue, name: str) -> bool:
    # An unknown tool name is treated as a write: the cautious reading.
    return name not in tq.app.registry or tq.app.registry.get(name).writes


# --------------------------------------------------------------------------- calling


async def run(
    tq: ToolQueue,
    tool: str,
    args: Any,
    *,
    ref: str,
    call_id: str | None,
    wait: float = DEFAULT_WAIT,
    on_progress: OnProgress | None = None,
) -> AnyEnvelope:
    """Submit ``tool(args)`` under ``ref`` and wait up to ``wait`` seconds: its envelope.

    Never raises for what the model or toolq did (a refused call, arguments
    that do not validate, an unknown tool, the server away, a bug here): each
    is an envelope. Past the wait, a PENDING envelope from the operation's
    record. A call the tool itself found invalid (``needs_input``) is
    cancelled: the model's corrected call is a new operation under its own
    call id, and an operation nobody will give input to would escalate after
    ``input_timeout``.
    """
    call_id = call_id_of(call_id, tq.settings.limits)
    deadline = _now(tq) + max(0.0, wait)
    submitted = False
    try:
        tq.app.registry.get(tool)  # UnknownTool before anything is sent
        submitted = True
        try:
            env: AnyEnvelope | None = await tq.aio.call(
                tool,
                args,
                operation_ref=ref,
                call_id=call_id,
                timeout=wait,
                on_progress=on_progress,
            )
        except TimeoutError:
            env = None
        env = await _settled_or_pending(tq, ref, env, deadline)
        if kind_of(env) is Kind.FIX_INPUT:
            await abandon(tq, ref)
        outage_of(tq).answered()
        return env
    except errors.ServerUnavailable as exc:
        outage_of(tq).failed(exc, str(exc))
        return unavailable_envelope(ref, tool, call_id, writes=writes(tq, tool) and submitted)
    except errors.RequestRefused as exc:
        return refused_envelope(exc, ref, tool, call_id, _max_attempts(tq, tool))
    except Exception:
        log.exception("toolq call of %s failed for %s", tool[:64], ref)
        may_have = submitted and writes(tq, tool)
        return unexpected_envelope(
            ref, tool if tool in tq.app.registry else None, call_id, may_have_submitted=may_have
        )


async def follow(
    tq: ToolQueue, ref: object, *, wait: float = DEFAULT_WAIT, call_id: str | None = None
) -> AnyEnvelope:
    """:data:`FOLLOW_TOOL`: the operation's envelope once it settles, PENDING past ``wait``.

    A ref the model made up is answered as an envelope: OPERATION_NOT_FOUND for
    one that has no operation, INVALID_ARGUMENTS (fix ``operation_ref``) for one
    that is not a ref at all.
    """
    limits = tq.settings.limits
    call_id = call_id_of(call_id, limits)
    if not isinstance(ref, str) or not limits.is_ref(ref):
        shown = stable_ref(str(ref)[:1000], limits=limits) or "none"
        bad = errors.InvalidArguments(
            "bad operation_ref", field_errors=[FieldError(field="operation_ref", rule="pattern")]
        )
        return refused_envelope(bad, shown, FOLLOW_TOOL, call_id)
    deadline = _now(tq) + max(0.0, wait)
    try:
        try:
            env: AnyEnvelope | None = await tq.aio.wait(ref, timeout=wait)
        except TimeoutError:
            env = None
        answer = await _settled_or_pending(tq, ref, env, deadline)
        outage_of(tq).answered()
        return answer
    except errors.ServerUnavailable as exc:
        outage_of(tq).failed(exc, str(exc))
        return unavailable_envelope(ref, None, call_id, writes=False)
    except errors.RequestRefused as exc:
        return refused_envelope(exc, ref, None, call_id)
    except Exception:
        log.exception("following %s failed", ref)
        return unexpected_envelope(ref, None, call_id, may_have_submitted=False)


async def resolve_approval(
    tq: ToolQueue,
    ref: str,
    approved: bool,
    *,
    wait: float = DEFAULT_WAIT,
    by: str = "agent",
    call_id: str | None = None,
) -> AnyEnvelope:
    """Forward a framework's approval decision to toolq, then :func:`follow` the operation.

    Approved: ``tq.aio.approve`` (the write runs once, under the same ref).
    Rejected: ``tq.aio.cancel`` (OPERATION_CANCELLED: nothing was sent). A
    decision that comes too late (the operation moved on, e.g. an operator
    already decided in the console, or a replay decides twice) is not an
    error: the operation's own envelope is the answer.
    """
    try:
        if approved:
            await tq.aio.approve(ref, by=f"{by}:approve")
        else:
            await tq.aio.cancel(ref, by=f"{by}:reject")
    except errors.InvalidState:
        pass
    except errors.OperationNotFound as exc:
        return refused_envelope(exc, ref, None, call_id)
    except errors.ServerUnavailable as exc:
        outage_of(tq).failed(exc, str(exc))
        return unavailable_envelope(ref, None, call_id, writes=False)
    return await follow(tq, ref, wait=wait, call_id=call_id)


#: Each app's outages of its server as the adapters' calls see them: said once.
_OUTAGES: weakref.WeakKeyDictionary[Any, OutageLog] = weakref.WeakKeyDictionary()
_OUTAGES_LOCK = threading.Lock()


def outage_of(tq: ToolQueue) -> OutageLog:
    """The log of ``tq``'s server outages: one line when calls start failing, one
    when one goes through again, however many calls an agent makes meanwhile."""
    with _OUTAGES_LOCK:
        said = _OUTAGES.get(tq.app)
        if said is None:
            outage = Outage("toolq's server", "ledger", meanwhile="calls answer QUEUE_UNAVAILABLE")
            said = _OUTAGES[tq.app] = OutageLog(outage, log)
        return said


def _now(tq: ToolQueue) -> float:
    # The clock tq.aio's waits use: a deadline taken before theirs is never later.
    return asyncio.get_running_loop().time()


async def _settled_or_pending(
    tq: ToolQueue, ref: str, env: AnyEnvelope | None, deadline: float
) -> AnyEnvelope:
    """``env`` if the wait ended because the operation settled; else what its record
    says now. A wait that reaches its deadline answers with the envelope the record
    holds, which may be an earlier attempt's (a rate limit already retried, an
    approval already given): never shown as the outcome."""
    if env is not None and _now(tq) < deadline:
        return env
    rec = await tq.aio.get(ref)
    if rec is None:
        raise errors.OperationNotFound("no such operation")
    if rec.state in SETTLED:
        return await tq.aio.wait(ref, 0.0)
    return pending_envelope(rec, writes=writes(tq, rec.tool), now=datetime.now(UTC))


async def abandon(tq: ToolQueue, ref: str) -> None:
    """Cancel the operation of a call the tool found invalid (kind FIX_INPUT): the
    model's corrected call is a new operation under its own call id."""
    # Nothing to cancel (refused at submit, or moved on): nothing to do.
    with contextlib.suppress(errors.RequestRefused):
        await tq.aio.cancel(ref, by="agent:corrected_input")


def _max_attempts(tq: ToolQueue, tool: str) -> int:
    registry = tq.app.registry
    return registry.get(tool).options.max_attempts if tool in registry else 1
