"""What an operator's action means for the ledger (pure): approve, provide input,
cancel, retry now, verify now, and the three ways a person settles an escalated
operation.

The API, the CLI and the console all reach these through ``ToolQueue``; each
returns the one compare-and-set that carries the action out, bound to the
revision the operator read, and recorded in the history with who did it (``by``).

==============  ==================  ==========================================
action          from                does
==============  ==================  ==========================================
approve         awaiting_approval   queues a new attempt (budget permitting)
provide_input   needs_input         new arguments, a new attempt
cancel          queued or waiting   cancelled (nothing of it is running)
retry_now       waiting_retry       the scheduler's dispatch, now: a new attempt
                                    counted, the same operation_ref
verify_now      verifying           the next verification check, now (not while
                                    one runs); "not found" still waits for the
                                    tool's consistency window (invariant 2)
resolve         escalated           committed: succeeded, the operator's result
(committed)                         (or reference) as the envelope's result and
                                    ``evidence_ref`` ``operator:<who>``
resolve (not    escalated           failed, ``RESOLVED_NOT_COMMITTED``: nothing
committed)                          was written, nothing will be sent
retry           escalated           queued: one attempt more, the same
(escalated)                         operation_ref, a new deadline window; at
                                    most ``operator_retries`` per operation
==============  ==================  ==========================================

A resolution needs a reason (the history keeps it with who gave it) and may name
the revision the operator read (``rev``): if the operation moved on since, it is
refused (``StaleRevision``) and nothing is written. These are the only moves out
of ``escalated`` (:data:`~toolq.decisions.recovery.transition.RESOLUTIONS`). The
escalated record had its retention TTL; a retry drops it (``ttl=0``), a resolution
sets it again. A retry clears the escalation's envelope: a caller waiting on the
ref from then on waits for the new attempt's outcome.

An action that would start an attempt the budget does not allow escalates, as
the scheduler would at the retry's time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from toolq.core import errors
from toolq.core.own_envelopes import (
    cancelled_envelope,
    operator_confirmed_envelope,
    resolved_not_committed_envelope,
)
from toolq.core.record import ms_to_dt
from toolq.core.redact import scrub
from toolq.core.states import State
from toolq.decisions.recovery.budget import Budgeted, Path, check
from toolq.decisions.recovery.moves import (
    Messages,
    Policy,
    check_again,
    escalate,
    next_attempt,
    refused,
    terminal,
)
from toolq.decisions.recovery.transition import Guard, Transition

#: The record fields an operator action reads.
FIELDS = (
    "state",
    "tool",
    "call_id",
    "fp",
    "blocked_fp",
    "attempt",
    "max_attempts",
    "rev",
    "deadline",
    "vcheck",
    "vholder",
    "vlease_until",
    "op_retries",
)

#: The longest reason and reference a resolution keeps (one line each).
REASON_MAX = 500
REFERENCE_MAX = 200

#: States an operation can be cancelled in: nothing of it is running.
CANCELLABLE = (State.QUEUED, State.WAITING_RETRY, State.NEEDS_INPUT, State.AWAITING_APPROVAL)


@dataclass(frozen=True)
class View(Budgeted):
    """An operation as an operator action reads it."""

    ref: str
    state: State
    tool: str
    call_id: str
    fp: str
    blocked_fp: str
    attempt: int
    max_attempts: int
    rev: str
    deadline_ms: int
    #: Verification: the check last published, who holds it and until when.
    vcheck: int = 0
    vholder: str = ""
    vlease_until_ms: int = 0
    #: Attempts operators added after an escalation (``retry_escalated``).
    op_retries: int = 0

    @classmethod
    def from_fields(cls, ref: str, f: dict[str, str]) -> View:
        if "state" not in f:
            raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
        return cls(
            ref=ref,
            state=State(f["state"]),
            tool=f.get("tool", ""),
            call_id=f.get("call_id", ""),
            fp=f.get("fp", ""),
            blocked_fp=f.get("blocked_fp", ""),
            attempt=int(f.get("attempt") or 0),
            max_attempts=int(f.get("max_attempts") or 0),
            rev=f.get("rev", ""),
            deadline_ms=int(float(f.get("deadline") or 0)),
            vcheck=int(f.get("vcheck") or 0),
            vholder=f.get("vholder", ""),
            vlease_until_ms=int(float(f.get("vlease_until") or 0)),
            op_retries=int(f.get("op_retries") or 0),
        )

    def require(self, state: State) -> None:
        if self.state is not state:
            raise errors.InvalidState(f"operation is {self.state}, not {state}", state=self.state)


#: The longest ``by`` an operator action takes (the edges' own are far shorter).
MAX_ACTOR = 200


def check_actor(by: object) -> None:
    """``by`` (who acts, as the history keeps it) is one line of printable text:
    ``InvalidArguments`` otherwise, before anything is read or written (a lone
    surrogate or a control character was refused by the ledger's script)."""
    if not (isinstance(by, str) and by.strip() and len(by) <= MAX_ACTOR and by.isprintable()):
        raise errors.InvalidArguments(
            f"by: who acts, one line of printable text of at most {MAX_ACTOR} characters"
        )


def cancel(v: View, policy: Policy, by: str = "operator:cancel") -> Transition | None:
    """Cancel an operation that has not started a write; None if it is cancelled already."""
    if v.state is State.CANCELLED:
        return None
    if v.state not in CANCELLABLE:
        raise errors.InvalidState(
            f"operation is {v.state}; only queued or waiting operations can be cancelled",
            state=str(v.state),
        )
    return terminal(
        Transition(
            ref=v.ref,
            states=(v.state,),
            to=State.CANCELLED,
            by=by,
            code="CANCELLED",
            expect={"*": {"rev": v.rev}},
            envelope=cancelled_envelope(v.ref, v.tool, v.call_id),
            stats=("cancelled",),
        ),
        policy,
    )


def approve(
    v: View, now_ms: int, policy: Policy, messages: Messages, by: str = "operator:approve"
) -> Transition:
    """Approve an operation awaiting approval, bound to its current arguments."""
    v.require(State.AWAITING_APPROVAL)
    r = _Requeue(Path.APPROVE, "APPROVED", {"approved_fp": v.fp}, ("fp", v.fp), by)
    return _requeue(v, r, now_ms, policy, messages)


def provide_input(
    v: View,
    args_json: str,
    fp: str,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    by: str = "operator:input",
) -> Transition:
    """Replace the arguments of an operation that needs input; identical ones are refused."""
    v.require(State.NEEDS_INPUT)
    if fp in (v.blocked_fp, v.fp):
        raise errors.InvalidArguments(
            "the arguments are identical to the ones that needed fixing",
            code_hint="ARGUMENTS_UNCHANGED",
        )
    r = _Requeue(
        Path.PROVIDE_INPUT,
        "INPUT_PROVIDED",
        {"args": args_json, "fp": fp},
        ("blocked_fp", v.blocked_fp),
        by,
    )
    return _requeue(v, r, now_ms, policy, messages)


def retry_now(
    v: View, now_ms: int, policy: Policy, messages: Messages, by: str = "operator:retry"
) -> Transition:
    """Dispatch a waiting retry now rather than at its time: what the scheduler's
    dispatch does (a new attempt counted, the same operation_ref), earlier."""
    v.require(State.WAITING_RETRY)
    r = _Requeue(Path.DISPATCH, "RETRY_NOW", {}, None, by, ("dispatched", "retried_now"))
    return _requeue(v, r, now_ms, policy, messages)


def verify_now(
    v: View, now_ms: int, policy: Policy, messages: Messages, by: str = "operator:verify"
) -> Transition:
    """Publish the next verification check now, instead of at its time.

    The check it replaces is superseded (its message, if still queued, is stale
    when a worker takes it: the claim wants the new ``vcheck``). Refused while a
    verifier holds a check: its verdict is minutes away at most.
    """
    v.require(State.VERIFYING)
    if v.vholder and v.vlease_until_ms > now_ms:
        raise errors.InvalidState(
            "a verification check of this operation is running now", state=str(v.state)
        )
    guard = Guard(
        ref=v.ref,
        states=(State.VERIFYING,),
        by=by,
        code="VERIFY_NOW",
        # vholder: a check claimed since the read (a claim does not move rev) refuses this
        expect={"*": {"rev": v.rev, "vcheck": str(v.vcheck), "vholder": v.vholder}},
    )
    stats = ("verify_published", "verified_now")
    return check_again(
        guard, v.attempt, v.vcheck, now_ms, policy, messages, quiet=False, stats=stats
    )


class Settle(StrEnum):
    """How an operator settles an escalated operation."""

    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"
    RETRY = "retry"

    @classmethod
    def parse(cls, value: object) -> Settle:
        try:
            return cls(str(value))
        except ValueError:
            raise errors.InvalidArguments(
                f"outcome must be one of {', '.join(s.value for s in cls)}",
                code_hint="BAD_OUTCOME",
            ) from None


@dataclass(frozen=True)
class Resolution:
    """What the operator says when settling an escalated operation."""

    by: str
    #: Why: what they checked (required; one line).
    reason: str
    #: The revision they read; empty: the current one.
    rev: str = ""
    #: Where they saw it (a provider's id, a ticket), optional.
    reference: str = ""

    def note(self) -> dict[str, str]:
        """The words the history entry keeps beside who acted: the reason and the
        reference, folded to one line and anything like a credential redacted."""
        said = {"reason": self.reason, "reference": self.reference}
        return {k: scrub(v) for k, v in said.items() if v}


def _checked(v: View, r: Resolution) -> Guard:
    """The guard of a resolution, after the checks every one makes."""
    if r.rev and r.rev != v.rev:
        raise errors.StaleRevision(
            f"the operation changed since it was read (revision {r.rev[:20]}, now {v.rev})",
            state=str(v.state),
        )
    v.require(State.ESCALATED)
    if not isinstance(r.reference, str):
        raise errors.InvalidArguments("the reference is text", code_hint="BAD_REFERENCE")
    reason = " ".join(r.reason.split()) if isinstance(r.reason, str) else ""
    if not reason:
        raise errors.InvalidArguments(
            "a reason is required: say what was checked", code_hint="REASON_REQUIRED"
        )
    if len(reason) > REASON_MAX or len(r.reference) > REFERENCE_MAX:
        raise errors.InvalidArguments(
            f"the reason is at most {REASON_MAX} characters, the reference {REFERENCE_MAX}",
            code_hint="REASON_TOO_LONG",
        )
    if r.reference and r.reference != " ".join(r.reference.split()):
        raise errors.InvalidArguments(
            "the reference is one line without surrounding spaces", code_hint="BAD_REFERENCE"
        )
    return Guard(ref=v.ref, states=(State.ESCALATED,), by=r.by, expect={"*": {"rev": v.rev}})


def _noted(t: Transition, r: Resolution) -> Transition:
    t.note = r.note()
    return t


def resolve_committed(
    v: View, now_ms: int, policy: Policy, r: Resolution, result: Any = None
) -> Transition:
    """The operator checked the provider and the write happened: ``succeeded``.

    The envelope's result is ``result`` if given, else ``{"reference": ...}``; one of
    the two is required. Its ``evidence_ref`` is ``operator:<who>``.
    """
    guard = replace(_checked(v, r), code="RESOLVED_COMMITTED")
    if result is None and not r.reference:
        raise errors.InvalidArguments(
            "give the write's result or a reference to it", code_hint="RESULT_REQUIRED"
        )
    shown = result if result is not None else {"reference": r.reference}
    env = operator_confirmed_envelope(v.ref, v.tool, v.call_id, shown, ms_to_dt(now_ms), r.by)
    t = guard.to(State.SUCCEEDED, envelope=env, stats=("resolved_committed",))
    return _noted(terminal(t, policy), r)


def resolve_not_committed(v: View, now_ms: int, policy: Policy, r: Resolution) -> Transition:
    """The operator checked the provider and nothing was written: ``failed``, for good."""
    guard = replace(_checked(v, r), code="RESOLVED_NOT_COMMITTED")
    env = resolved_not_committed_envelope(v.ref, v.tool, v.call_id)
    t = guard.to(State.FAILED, envelope=env, stats=("resolved_not_committed",))
    return _noted(terminal(t, policy), r)


def retry_escalated(
    v: View, now_ms: int, policy: Policy, messages: Messages, r: Resolution, window_ms: int
) -> Transition:
    """The operator confirmed nothing was written: one attempt more, the same
    operation_ref (the only way a write leaves ``escalated`` and runs again).

    The attempt is the operator's: ``max_attempts`` becomes this attempt, and a
    deadline, if the operation has one, ``window_ms`` from now (the tool's own
    deadline), so the claim's budget check lets it start. At most
    ``policy.operator_retries`` per operation (``OperatorRetriesSpent``).
    """
    guard = _checked(v, r)
    if v.op_retries >= policy.operator_retries:
        raise errors.OperatorRetriesSpent(
            f"operators have retried this operation {v.op_retries} times, the most "
            f"recovery.operator_retries allows ({policy.operator_retries}); resolve it as "
            "committed or not committed",
            state=str(v.state),
        )
    guard = replace(guard, code="RESOLVED_RETRY", delete=("envelope",))
    deadline_ms = now_ms + window_ms if v.deadline_ms else 0
    budget = {
        "op_retries": str(v.op_retries + 1),
        "max_attempts": str(v.attempt + 1),
        **({"deadline": str(deadline_ms)} if deadline_ms else {}),
    }
    t = next_attempt(
        guard,
        replace(v, max_attempts=v.attempt + 1, deadline_ms=deadline_ms),
        now_ms,
        policy,
        messages,
        set={**budget, "repubs": "0"},
        stats=("resolved_retry",),
    )
    t.ttl = 0  # the record lives again: escalated set its retention TTL
    return _noted(t, r)


def resolve(
    v: View,
    how: Settle,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    r: Resolution,
    *,
    result: Any = None,
    window_ms: int,
) -> Transition:
    """The transition of one of the three resolutions (a result only with committed)."""
    if result is not None and how is not Settle.COMMITTED:
        raise errors.InvalidArguments(
            "a result goes only with committed", code_hint="RESULT_NOT_EXPECTED"
        )
    if how is Settle.COMMITTED:
        return resolve_committed(v, now_ms, policy, r, result)
    if how is Settle.NOT_COMMITTED:
        return resolve_not_committed(v, now_ms, policy, r)
    return retry_escalated(v, now_ms, policy, messages, r, window_ms)


@dataclass(frozen=True)
class _Requeue:
    """What an operator action that starts a new attempt changes, and checks."""

    path: Path
    code: str
    set: dict[str, str]
    #: A field that must still hold this value: the arguments the operator saw.
    guard: tuple[str, str] | None
    by: str
    stats: tuple[str, ...] = ()


def _requeue(v: View, r: _Requeue, now_ms: int, policy: Policy, messages: Messages) -> Transition:
    """Queue a new attempt, if the budget allows one now; escalate if it does not."""
    guard = {"*": {"rev": v.rev, **dict([r.guard] if r.guard else [])}}
    base = Guard(ref=v.ref, states=(v.state,), by=r.by, code=r.code, expect=guard)
    verdict = check(v.budget(), r.path, now_ms)
    if not verdict.ok:
        env = refused(verdict, v.ref, v.tool, v.call_id)
        return escalate(replace(base, code=verdict.value), env, policy)
    return next_attempt(
        base, v, now_ms, policy, messages, set={**r.set, "repubs": "0"}, stats=r.stats
    )
