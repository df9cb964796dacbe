"""What every framework adapter shares: the ref, the kind of outcome, the bounded
wait, and the text the model sees. Imports toolq only, never a framework.

    ref = stable_ref(tool_call_id, scope=run_id, limits=tq.settings.limits)
    env = await run(tq, "create_invoice", args, ref=ref, call_id=tool_call_id, wait=20.0)
    match kind_of(env):
        case Kind.RESULT: ...     # env.result to the model
        case Kind.FIX_INPUT: ...  # the framework's "fix your input" signal, model_text(env)
        case Kind.APPROVAL: ...   # the framework's pause; then resolve_approval(...)
        case Kind.PENDING: ...    # model_text(env): not done yet, never call again
        case Kind.FAILED: ...     # a terminal error, model_text(env)

- **The ref** of a framework's tool call is its tool-call id, prefixed by the
  run, conversation or thread id where the framework has one
  (:func:`stable_ref`): a resumed or replayed step sends the same call id, so
  it reaches the same operation (the same arguments return it; other
  arguments are refused), never a second write under a fresh key.
- **The wait** (:func:`run`) is bounded: past it, the model gets a PENDING
  envelope carrying the ref, from the operation's record (never the stale
  envelope of an earlier attempt). Rate limits and outages are retried by
  toolq's scheduler meanwhile, unknown outcomes verified; the framework
  retries nothing. The model follows the ref with the :data:`FOLLOW_TOOL`
  tool (:func:`follow`).
- **The text** (:func:`model_text`) is the envelope's ``agent_message`` and its
  JSON, as :mod:`toolq.render` writes it: the envelope is redacted when it is
  built, and nothing here adds exception or upstream text. A framework whose
  tools answer with text gives a committed call's result as its JSON
  (:func:`output_text`).
- **The envelopes** an adapter writes itself (a refusal, a wait that ended
  first, its own failure) come from :mod:`toolq.edge_envelopes`, as the MCP
  server's do, naming :data:`FOLLOW_TOOL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from toolq import edge_envelopes, errors
from toolq.aio import OnProgress
from toolq.envelope import (
    AnyEnvelope,
    Category,
    Directive,
    FieldError,
    NextAction,
    Retry,
    ToolError,
    ToolSuccess,
)
from toolq.record import OperationRecord
from toolq.render import to_text
from toolq.settings import LimitSettings
from toolq.states import SETTLED

if TYPE_CHECKING:
    from toolq.queue import ToolQueue

log = logging.getLogger("toolq.integrations")

#: Seconds a framework's tool call waits for its operation before it answers PENDING.
DEFAULT_WAIT = 20.0
#: What a PENDING answer for a queued or delayed operation tells the model to wait.
POLL_S = 1.0
#: The built-in tool an adapter adds for following a pending operation by its ref.
FOLLOW_TOOL = "toolq_get_operation"
FOLLOW_DESCRIPTION = (
    "Read a toolq operation by operation_ref (from an earlier tool result that was "
    "still pending), waiting a while for it to finish; returns its result or envelope. "
    "Use it instead of calling the original tool again."
)

_AFTER_APPROVAL = (
    f"Once a person approves it, follow operation_ref with {FOLLOW_TOOL}; "
    "do not call the tool again."
)

#: The digest a too-long or odd call id is replaced by: ``#`` and 32 hex digits.
_DIGEST_LEN = 32
_NOT_REF = re.compile(r"[^A-Za-z0-9_.:@+=-]")  # "/" and "#" are the digest form's own


# --------------------------------------------------------------------------- refs


def stable_ref(
    call_id: str | None, *, scope: str | None = None, limits: LimitSettings | None = None
) -> str | None:
    """The operation_ref of a framework's tool call: ``scope/call_id``, or ``call_id``.

    ``scope`` is the run, conversation or thread id where the framework has a
    stable one. A result that would not be a valid ref (too long for
    ``limits.max_ref_length``, or characters outside the ref alphabet), and
    one whose scope or call id holds a ``/`` (``a/b`` + ``c`` and ``a`` +
    ``b/c`` would read alike), becomes ``<readable prefix>#<32 hex digits>``,
    the SHA-256 of the pair: the same call always maps to the same ref, two
    different calls never to one. None when there is no call id: the caller
    must then pass a ref of its own (a fresh one per call would make every
    replay a new write).
    """
    if not call_id:
        return None
    limits = limits or LimitSettings()
    scope = scope or None
    raw = f"{scope}/{call_id}" if scope else call_id
    if limits.is_ref(raw) and "/" not in call_id and "/" not in (scope or ""):
        return raw
    pair = json.dumps([scope, call_id], ensure_ascii=True)  # one encoding per pair
    digest = hashlib.sha256(pair.encode()).hexdigest()[:_DIGEST_LEN]
    room = limits.max_ref_length - _DIGEST_LEN - 1
    prefix = _NOT_REF.sub("_", raw)[:room]
    return f"{prefix}#{digest}"


def call_id_of(value: object, limits: LimitSettings | None = None) -> str | None:
    """``value`` as the call_id toolq records (the framework's id), when it is a
    ref-shaped string; None otherwise (the ref still carries it, digested)."""
    limits = limits or LimitSettings()
    if isinstance(value, str) and limits.is_ref(value):
        return value
    return None


# --------------------------------------------------------------------------- kinds


class Kind(StrEnum):
    """What a framework does with an envelope (:func:`kind_of`)."""

    #: Committed: the result goes to the model.
    RESULT = "result"
    #: The model must correct the named fields: the framework's retry signal.
    FIX_INPUT = "fix_input"
    #: A person must approve first: the framework's pause, then resolve_approval().
    APPROVAL = "approval"
    #: Not finished: toolq retries, verifies or runs it; the model follows the ref
    #: and never calls the tool again (the framework never retries it either).
    PENDING = "pending"
    #: Terminal: escalated, conflict, refused, cancelled, exhausted.
    FAILED = "failed"


#: next_action -> kind, for error envelopes.
KINDS: dict[NextAction, Kind] = {
    NextAction.CORRECT_INPUT: Kind.FIX_INPUT,
    NextAction.REQUEST_APPROVAL: Kind.APPROVAL,
    # An unknown outcome toolq is verifying (commit_state unknown).
    NextAction.VERIFY_OPERATION: Kind.PENDING,
    # toolq's scheduler retries it at not_before; the model must not.
    NextAction.WAIT_AND_RETRY: Kind.PENDING,
    # An unknown outcome nothing will verify is escalated too: terminal for the agent.
    NextAction.ESCALATE: Kind.FAILED,
    NextAction.REREAD_STATE: Kind.FAILED,
    NextAction.CHOOSE_ALLOWED_OPERATION: Kind.FAILED,
}


def kind_of(envelope: AnyEnvelope) -> Kind:
    """The kind of an envelope (pure; :data:`KINDS`)."""
    if isinstance(envelope, ToolSuccess):
        return Kind.RESULT
    return KINDS[envelope.next_action]


# --------------------------------------------------------------------------- the model's text


def model_text(envelope: AnyEnvelope) -> str:
    """What the model reads: one line (``agent_message``; for FIX_INPUT the fields to
    fix, for APPROVAL how to follow it), then the envelope's compact JSON, as
    :func:`toolq.render.to_text` writes them. Fixed text only: nothing here can carry
    a secret."""
    if isinstance(envelope, ToolSuccess):
        return to_text(envelope)
    line = envelope.agent_message
    if kind_of(envelope) is Kind.APPROVAL:
        line = f"{line} {_AFTER_APPROVAL}"
    if envelope.field_errors:
        fields = ", ".join(f"{fe.field} ({fe.rule})" for fe in envelope.field_errors)
        line = f"{line} Fields to fix: {fields}."
    return to_text(envelope, line)


def output_text(envelope: AnyEnvelope) -> str:
    """A tool's output as text for the model: a committed call's result as compact
    JSON, anything else as :func:`model_text`."""
    if isinstance(envelope, ToolSuccess):
        result = envelope.model_dump(mode="json", include={"result"})["result"]
        return json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    return model_text(envelope)


def field_names(envelope: AnyEnvelope) -> list[str]:
    """The fields a FIX_INPUT envelope names (``field_errors``, else ``safe_details.field``)."""
    if isinstance(envelope, ToolSuccess):
        return []
    if envelope.field_errors:
        return [fe.field for fe in envelope.field_errors]
    field = envelope.safe_details.get("field")
    return [field] if isinstance(field, str) else []


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


def follow_schema(limits: LimitSettings | None = None) -> dict[str, Any]:
    """The JSON Schema of :data:`FOLLOW_TOOL`'s arguments (strict-mode compatible)."""
    limits = limits or LimitSettings()
    ref = {
        "type": "string",
        "description": "The operation_ref of the pending operation.",
        "maxLength": limits.max_ref_length,
        "pattern": limits.ref_pattern,
    }
    return {
        "type": "object",
        "properties": {"operation_ref": ref},
        "required": ["operation_ref"],
        "additionalProperties": False,
    }


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
        return env
    except errors.ServerUnavailable:
        log.warning("toolq server unavailable for %s", ref, exc_info=True)
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
        return await _settled_or_pending(tq, ref, env, deadline)
    except errors.ServerUnavailable:
        log.warning("toolq server unavailable following %s", ref, exc_info=True)
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
    except errors.ServerUnavailable:
        log.warning("toolq server unavailable deciding %s", ref, exc_info=True)
        return unavailable_envelope(ref, None, call_id, writes=False)
    return await follow(tq, ref, wait=wait, call_id=call_id)


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


# --------------------------------------------------------------------------- envelopes
#
# From toolq.edge_envelopes, which the MCP edge shares, naming FOLLOW_TOOL.


def pending_envelope(record: OperationRecord, *, writes: bool, now: datetime) -> ToolError:
    """OPERATION_PENDING for an operation the wait left unsettled (kind PENDING);
    one not running is followed again after :data:`POLL_S` seconds."""
    return edge_envelopes.pending_envelope(
        record, writes=writes, poll=POLL_S, now=now, follow_tool=FOLLOW_TOOL
    )


def refused_envelope(
    exc: errors.RequestRefused,
    ref: str,
    tool: str | None,
    call_id: str | None,
    max_attempts: int = 1,
) -> ToolError:
    """What a refused request tells the model; nothing was created by it."""
    return edge_envelopes.refused_envelope(
        exc, ref, tool, call_id, max_attempts, follow_tool=FOLLOW_TOOL
    )


def unexpected_envelope(
    ref: str, tool: str | None, call_id: str | None, *, may_have_submitted: bool
) -> ToolError:
    """A failure in the adapter itself: a submitted write may be running (PENDING)."""
    return edge_envelopes.unexpected_envelope(
        ref, tool, call_id, may_have_submitted=may_have_submitted, follow_tool=FOLLOW_TOOL
    )


def unavailable_envelope(
    ref: str, tool: str | None, call_id: str | None, *, writes: bool
) -> ToolError:
    """toolq's server did not answer. A write may have been queued: follow the ref
    before anything else (kind PENDING); a read was not: try later (PENDING too)."""
    if writes:
        return edge_envelopes.edge_error(
            "QUEUE_UNAVAILABLE",
            Category.DEPENDENCY,
            ref,
            tool,
            call_id,
            f"The call may have been queued. Follow operation_ref with {FOLLOW_TOOL} "
            "before calling the tool again.",
            "I could not confirm whether this was queued; I am checking.",
            unknown=True,
            safe_details={"verification_tool": FOLLOW_TOOL},
        )
    now = datetime.now(UTC)
    return edge_envelopes.edge_error(
        "QUEUE_UNAVAILABLE",
        Category.DEPENDENCY,
        ref,
        tool,
        call_id,
        "The tool queue is unavailable; try again after retry_after seconds.",
        "This is unavailable right now; I will try again shortly.",
        retry=Retry(
            directive=Directive.AFTER_DELAY,
            not_before=now + timedelta(seconds=5 * POLL_S),
            max_attempts_remaining=1,
        ),
        next_action=NextAction.WAIT_AND_RETRY,
        safe_details={"retry_after": 5 * POLL_S},
    )


__all__ = [
    "DEFAULT_WAIT",
    "FOLLOW_DESCRIPTION",
    "FOLLOW_TOOL",
    "KINDS",
    "Kind",
    "abandon",
    "call_id_of",
    "describe",
    "field_names",
    "follow",
    "follow_schema",
    "kind_of",
    "model_text",
    "output_text",
    "pending_envelope",
    "refused_envelope",
    "resolve_approval",
    "run",
    "stable_ref",
    "tool_names",
    "unavailable_envelope",
    "unexpected_envelope",
    "writes",
]
