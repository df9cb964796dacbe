"""What an operator's action means for the ledger (pure): approve, provide input,
cancel, retry now, verify now.

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
==============  ==================  ==========================================

An action that would start an attempt the budget does not allow escalates, as
the scheduler would at the retry's time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolq.core import errors
from toolq.core.own_envelopes import cancelled_envelope
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
)

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
        )

    def require(self, state: State) -> None:
        if self.state is not state:
            raise errors.InvalidState(f"operation is {self.state}, not {state}", state=self.state)


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
