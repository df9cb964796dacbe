"""What a call means before and after the ledger, shared by ``tq`` and ``tq.aio`` (pure).

The sync client (:mod:`toolq.client.queue`) and the async one (:mod:`toolq.client.aio`) do
the same things over different connections: check the ref and the arguments,
build the operation a submit writes, read the answer, and decide what a
waiter does with a record it read or a notice it heard. Those decisions live
here, once, with no I/O; each client only carries out the round trips.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter, ValidationError

from toolq.core import errors
from toolq.core import own_envelopes as envelopes
from toolq.core.deps import DEP_KEY_PATTERN, is_dep_key
from toolq.core.envelope import FieldError, Ref, ToolError, ToolSuccess
from toolq.core.ids import uuid4_hex
from toolq.core.record import load_envelope
from toolq.core.settings import REF_RULE, LimitSettings
from toolq.core.states import SETTLED, State
from toolq.core.tools import Tool, canonical_json, fingerprint
from toolq.decisions.recovery.outcome import Policy
from toolq.decisions.recovery.transition import Transition

#: How long a waiter trusts the notices alone: past it, it reads the record once
#: more, in case a notice was lost (a subscription that dropped without an error).
#: Slow on purpose: it is the only read a healthy wait makes besides its first.
FALLBACK_READ_S = 12.0

#: The record fields a waiter reads.
WAIT_FIELDS = ("state", "envelope", "tool", "call_id", "rev")


def wait_seconds(timeout: object) -> float:
    """How long a wait may last, in seconds: ``timeout`` (negative is 0; a number
    past a float's range is forever). ``TypeError`` for what is not a number of
    seconds (``None`` included: there is no wait without an end by accident),
    ``ValueError`` for NaN, which compares as neither more nor less than a time."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int past a float's range
        return math.inf
    if math.isnan(seconds):
        raise ValueError("timeout must be a number of seconds, not NaN")
    return max(0.0, seconds)


@dataclass(frozen=True)
class Submission:
    operation_ref: str
    state: State
    created: bool
    #: Advisory, never a change of state: e.g. no live worker for the tool's queue
    #: (toolq.adapters.liveness; read at most every few seconds per process).
    warnings: tuple[str, ...] = ()


# --------------------------------------------------------------------------- before the ledger


def operation_ref(
    given: str | None, run_id: str | None, step: str | int | None, limits: LimitSettings
) -> str:
    """The ref a call runs under: the one given, ``run_id/step``, or a new ``op_<hex>``."""
    if given is None and run_id is not None and step is not None:
        given = f"{run_id}/{step}"
    if given is None:
        return f"op_{uuid4_hex()}"
    check_ref(given, limits)
    return given


def require_existing(ref: object, limits: LimitSettings) -> None:
    """A ref no operation can have (not a string, too long, a control character) is
    answered as one that does not exist, by both clients: not by a failure to build
    its keys."""
    if not limits.is_ref(ref):
        raise errors.OperationNotFound("no operation with that ref")


def check_ref(ref: object, limits: LimitSettings, field: str = "operation_ref") -> str:
    """``ref`` when it is an acceptable operation_ref; :class:`errors.InvalidArguments` if not."""
    if not limits.is_ref(ref):
        raise errors.InvalidArguments(
            f"{field} must be 1-{limits.max_ref_length} characters of {REF_RULE}",
            field_errors=[FieldError(field=field, rule="pattern")],
        )
    assert isinstance(ref, str)
    return ref


def check_call_id(call_id: object, limits: LimitSettings) -> str:
    """``call_id`` as the envelope will carry it (:data:`toolq.core.envelope.Ref`): one line,
    no control character, UTF-8. Else every envelope of the operation failed to build
    in the worker, and it never settled (a read was run again at each lease expiry)."""
    longest = limits.max_ref_length
    if call_id is not None and (
        not isinstance(call_id, str) or len(call_id) > longest or not _envelope_ref(call_id)
    ):
        raise errors.InvalidArguments(
            f"call_id must be a string of at most {longest} characters on one line, "
            "without control characters"
        )
    return call_id or ""


_REF = TypeAdapter(Ref)


def _envelope_ref(text: str) -> bool:
    try:
        text.encode()  # a lone surrogate: UnicodeEncodeError
        return text == "" or _REF.validate_python(text) == text
    except (ValueError, ValidationError):
        return False


def canonical_args(tool: Tool[Any], args: Any, limits: LimitSettings) -> str:
    """The arguments validated by the tool's model, as canonical JSON within the size limit."""
    model = tool.validate(args)
    try:
        canonical = canonical_json(model)
        size = len(canonical.encode())  # UnicodeEncodeError (a ValueError): a lone surrogate
    except (TypeError, ValueError):
        raise errors.InvalidArguments("arguments are not JSON-serialisable") from None
    cap = limits.max_args_bytes
    if size > cap:
        raise errors.InvalidArguments(f"arguments are larger than the {cap}-byte limit", limit=cap)
    return canonical


@dataclass(frozen=True)
class NewOperation:
    """What a submit asks the ledger to create: the arguments of ``Ledger.submit``."""

    ref: str
    tool: str
    args_json: str
    fp: str
    call_id: str
    now_ms: int
    max_attempts: int
    deadline_ms: int
    state: State
    due_ms: int
    queue: str
    message: str
    #: More record fields the submit writes with the others (a dependency key, a trace
    #: context): (field, value) pairs, each value a string.
    extra: tuple[tuple[str, str], ...] = ()

    def ledger_args(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _NEW_OPERATION_FIELDS}


_NEW_OPERATION_FIELDS = tuple(NewOperation.__dataclass_fields__)


def new_operation(
    tool: Tool[Any],
    args_json: str,
    ref: str,
    call_id: str,
    now_ms: int,
    policy: Policy,
    run_message: Callable[[str, int], tuple[str, str]],
    trace: str = "",
) -> NewOperation:
    """The operation a submit creates: queued with its first message, or awaiting approval.

    ``trace``: the submitter's trace context (``toolq.process.tracing.carrier``), kept
    in the record's ``trace`` field for every later step; "" writes none."""
    state = State.AWAITING_APPROVAL if tool.options.requires_approval else State.QUEUED
    dep = dependency_of(tool, args_json)
    queue, message = run_message(ref, 1) if state is State.QUEUED else ("", "")
    wait_ms = policy.unclaimed_after_ms if state is State.QUEUED else policy.approval_timeout_ms
    return NewOperation(
        ref=ref,
        tool=tool.name,
        args_json=args_json,
        fp=fingerprint(args_json),
        call_id=call_id,
        now_ms=now_ms,
        max_attempts=tool.options.max_attempts,
        deadline_ms=now_ms + int(tool.options.deadline * 1000),
        state=state,
        due_ms=now_ms + wait_ms,
        queue=queue,
        message=message,
        extra=_extra(dep=dep, trace=trace),
    )


def dependency_of(tool: Tool[Any], args_json: str) -> str | None:
    """The call's dependency key (``@tq.tool(dependency=...)``), the function form
    evaluated on the validated arguments; :class:`errors.InvalidArguments` for a key
    function that raises or returns no key (nothing is written)."""
    dep = tool.options.dependency
    if dep is None or isinstance(dep, str):
        return dep
    try:
        key = dep(tool.args_model.model_validate_json(args_json))
    except Exception as exc:
        raise errors.InvalidArguments(
            f"tool {tool.name}: its dependency key function raised {type(exc).__name__}",
            field_errors=[FieldError(field="dependency", rule="key_function")],
        ) from None
    if not is_dep_key(key):
        raise errors.InvalidArguments(
            f"tool {tool.name}: its dependency key function returned no dependency key "
            f"({DEP_KEY_PATTERN})",
            field_errors=[FieldError(field="dependency", rule="pattern")],
        )
    assert isinstance(key, str)
    return key


# --------------------------------------------------------------------------- the ledger's answers


def submitted(op: NewOperation, outcome: str, state: State) -> Submission:
    """The submit's answer; a ref already used with other arguments is refused."""
    if outcome == "conflict":
        raise errors.IdempotencyKeyReused(
            "this operation_ref was already used with other arguments",
            envelope=envelopes.fixed_envelope(
                "IDEMPOTENCY_KEY_REUSED", op.ref, op.tool, op.call_id or None
            ),
            operation_ref=op.ref,
        )
    return Submission(op.ref, state, outcome == "created")


def applied(t: Transition, answer: str) -> State:
    """An operator action's answer: the state it moved to, or why not.

    A cancel that lost a race to another is done all the same: cancelling what is
    cancelled already answers ``cancelled`` (``recovery.operator.cancel``), and two
    operators (or one double click) cancelling at once got a 409 for one of them.
    """
    if answer == State.CANCELLED and t.to is State.CANCELLED:
        return t.to
    if answer != "ok":
        raise errors.InvalidState(
            f"operation changed meanwhile (now {answer}); read it again", state=answer
        )
    return t.to


# --------------------------------------------------------------------------- waiting


@dataclass(frozen=True)
class Seen:
    """What a waiter knows of an operation: from its one read, then from notices.

    ``envelope`` is trusted only in a settled state: a notice of an unsettled
    one may carry none while the record still holds an older one (the timeout
    path reads the record again instead).
    """

    ref: str
    state: State
    rev: int
    tool: str
    call_id: str
    envelope: ToolSuccess | ToolError | None = None

    @classmethod
    def read(cls, ref: str, fields: dict[str, str]) -> Seen:
        """From :data:`WAIT_FIELDS` as read; :class:`errors.OperationNotFound` if none."""
        if "state" not in fields:
            raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
        raw = fields.get("envelope")
        return cls(
            ref=ref,
            state=State(fields["state"]),
            rev=int(fields.get("rev") or 0),
            tool=fields.get("tool", ""),
            call_id=fields.get("call_id", ""),
            envelope=load_envelope(raw) if raw else None,
        )

    @classmethod
    def created(cls, op: NewOperation) -> Seen:
        """What a submit that created the operation knows without reading it (revision 1)."""
        return cls(op.ref, op.state, 1, op.tool, op.call_id)

    def result(self) -> ToolSuccess | ToolError | None:
        """The envelope to return when the operation needs nothing more; else None."""
        if self.state not in SETTLED:
            return None
        env = self.envelope
        if env is None:  # approval required before the first attempt
            env = envelopes.needs_approval_envelope(self.ref, self.tool, self.call_id or None)
        if env.ok and self.state is not State.SUCCEEDED:  # pragma: no cover - invariant 8
            raise AssertionError("a success envelope on an unsettled write")
        return env

    def timed_out(self) -> ToolError:
        """On timeout: the current error envelope (OUTCOME_UNKNOWN while verifying, ...)."""
        if self.envelope is not None and not self.envelope.ok:
            return self.envelope
        raise TimeoutError(f"operation {self.ref[:80]} is still {self.state}")

    def heard(self, state: State, rev: int, envelope: str) -> Seen | None:
        """After a notice: what the waiter knows now, or None when it must read the record.

        An older notice adds nothing (it was published before the read). One of
        the same revision that names another state contradicts the read: read
        again. A newer settled one without an envelope (created awaiting
        approval) is read too, since the record may hold an envelope the notice
        does not; every other newer notice is taken as it is, with no read.
        """
        if rev < self.rev:
            return self
        if rev == self.rev:
            return self if state is self.state else None
        if state not in SETTLED:
            return replace(self, state=state, rev=rev, envelope=None)
        if not envelope:
            return None
        try:
            env = load_envelope(envelope)
        except ValueError:  # not an envelope (pydantic's error is one): the record says
            return None
        return replace(self, state=state, rev=rev, envelope=env)


def _extra(**fields: str | None) -> tuple[tuple[str, str], ...]:
    """The record fields a submit adds beyond the fixed ones: those with a value."""
    return tuple((name, value) for name, value in fields.items() if value)
