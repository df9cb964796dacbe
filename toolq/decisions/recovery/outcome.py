"""From what happened to the transition the ledger should make (pure).

The worker runs a tool, the verifier looks an operation up, the scheduler
finds something due; each asks this module which transition that means. The
answers are :class:`~toolq.decisions.recovery.transition.Transition` values, applied by
the ledger as one compare-and-set each.

Every path that would start another attempt asks the budget first
(:func:`toolq.decisions.recovery.budget.check`); every path that ends ``escalated`` goes
through :func:`~toolq.decisions.recovery.moves.escalate`, whose envelope must say
``next_action: escalate``. :class:`Policy`, :class:`Messages`, :func:`escalate`,
:func:`refused` and :func:`terminal` are :mod:`toolq.decisions.recovery.moves`' (imported here too).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from toolq.core import errors
from toolq.core.envelope import (
    CommitState,
    Directive,
    NextAction,
    ToolError,
)
from toolq.core.own_envelopes import (
    escalation_envelope,
    success_envelope,
    unknown_envelope,
    unverifiable_envelope,
)
from toolq.core.record import ms_to_dt
from toolq.core.states import State
from toolq.core.tools import Tool
from toolq.core.tools.data import ResultTooLarge
from toolq.decisions.deps import signal_of
from toolq.decisions.recovery.budget import (
    Budgeted,
    Path,
    Verdict,
    attempts_remaining,
    cap_retry,
    check,
)
from toolq.decisions.recovery.moves import LEASE, VLEASE, next_attempt
from toolq.decisions.recovery.moves import Messages as Messages
from toolq.decisions.recovery.moves import Policy as Policy
from toolq.decisions.recovery.moves import escalate as escalate
from toolq.decisions.recovery.moves import refused as refused
from toolq.decisions.recovery.moves import terminal as terminal
from toolq.decisions.recovery.policy import jittered_due, verify_backoff_ms
from toolq.decisions.recovery.transition import Guard, Transition

# ---------------------------------------------------------------- the worker's outcome


@dataclass(frozen=True)
class Claimed(Budgeted):
    """What a worker's claim (of an attempt or of a check) hands it: the operation,
    its tool, its budget."""

    ref: str
    tool: Tool[Any]
    call_id: str
    attempt: int
    max_attempts: int
    deadline_ms: int


@dataclass(frozen=True)
class Attempt(Claimed):
    """The attempt a worker claimed (from the ledger's claim)."""

    fp: str
    vcheck: int
    holder: str

    def base(self, code: str | None) -> Guard:
        """The guard of every transition out of this claim: still ours, still running."""
        return Guard(
            ref=self.ref,
            states=(State.RUNNING,),
            expect={"running": {"attempt": str(self.attempt), "lease_holder": self.holder}},
            by=self.holder,
            code=code,
            delete=LEASE,
        )


def before_call(a: Attempt, now_ms: int, policy: Policy) -> Transition | None:
    """The budget's word after a claim, before the tool is called: None to go ahead.

    The claim (Lua) hands back the deadline; the check is here so that the one
    budget decides it. A refused attempt never reaches the tool: it escalates.
    """
    verdict = check(a.budget(), Path.CLAIM, now_ms)
    if verdict.ok:
        return None
    return escalate(a.base(verdict.value), refused(verdict, a.ref, a.tool.name, a.call_id), policy)


def after_success(a: Attempt, result: Any, now_ms: int, policy: Policy) -> Transition:
    """A tool returned: the write is committed (a success is accepted even after
    the lease was lost and the operation went to verification: it is proof).

    Raises for a result the ledger cannot keep, for :func:`after_failure`: JSON cannot
    hold it (``ValueError``), or it is past ``limits.max_result_bytes``: a write's
    :class:`ResultTooLarge` as it is (it ran: looked up, as any unexpected error after
    a write), a read's as ``RESULT_TOO_LARGE`` (escalated: the tool needs a fix)."""
    try:
        env = success_envelope(
            a.ref,
            a.tool.name,
            a.call_id,
            result,
            ms_to_dt(now_ms),
            max_bytes=policy.max_result_bytes,
        )
    except ResultTooLarge as exc:
        if a.tool.writes:
            raise
        raise errors.ToolFailure(str(exc), code="RESULT_TOO_LARGE") from exc
    return terminal(
        Transition(
            ref=a.ref,
            states=(State.RUNNING, State.VERIFYING),
            expect={
                "running": {"attempt": str(a.attempt), "lease_holder": a.holder},
                "verifying": {"attempt": str(a.attempt)},
            },
            to=State.SUCCEEDED,
            by=a.holder,
            envelope=env,
            stats=("succeeded",),
            delete=(*LEASE, *VLEASE),
        ),
        policy,
    )


def after_failure(
    a: Attempt,
    exc: BaseException,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    rng: random.Random,
) -> Transition:
    """A tool raised: classify by the table, then route by what the envelope says."""
    tool = a.tool
    env = errors.error_envelope(
        exc,
        writes=tool.writes,
        operation_ref=a.ref,
        operation=tool.name,
        call_id=a.call_id or None,
        attempts_remaining=attempts_remaining(a.attempt, a.max_attempts),
        now=ms_to_dt(now_ms),
        verification_tool=tool.verification_tool,
        safe_detail_keys=tool.options.safe_details,
    )
    t = _classified(a, exc, env, now_ms, policy, messages, rng)
    signal = signal_of(exc) if tool.options.dependency is not None else None
    if signal is not None:  # what its dependency key learns (lua_deps: dep_after)
        t.set = {**t.set, "dep_signal": signal}
    return t


def _classified(
    a: Attempt,
    exc: BaseException,
    env: ToolError,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    rng: random.Random,
) -> Transition:
    tool = a.tool
    base = a.base(env.code)
    if env.commit_state is CommitState.UNKNOWN:
        # Verification is not an attempt: it runs whatever the budget says (invariant 2).
        u = Uncertain(a.ref, tool, a.call_id, a.attempt, a.vcheck)
        return enter_verifying(u, now_ms, policy, messages, base=base, env=env)
    if errors.rule_for(exc, writes=tool.writes).directive is Directive.AFTER_DELAY:
        return _delayed_retry(a, env, now_ms, policy, rng)
    if env.retry.directive is Directive.AFTER_INPUT_FIX:
        return base.to(
            State.NEEDS_INPUT,
            envelope=env,
            set={"blocked_fp": a.fp},
            due_ms=now_ms + policy.input_timeout_ms,
        )
    if env.next_action is NextAction.REQUEST_APPROVAL:
        return base.to(
            State.AWAITING_APPROVAL, envelope=env, due_ms=now_ms + policy.approval_timeout_ms
        )
    if env.next_action is NextAction.ESCALATE:
        return escalate(base, env, policy)
    return terminal(base.to(State.FAILED, envelope=env, stats=("failed",)), policy)


def _delayed_retry(
    a: Attempt, env: ToolError, now_ms: int, policy: Policy, rng: random.Random
) -> Transition:
    """A failure that may be retried after a delay: wait, if the budget allows the retry."""
    b = a.budget()
    nb = env.retry.not_before
    nb_ms = now_ms if nb is None else int(nb.timestamp() * 1000)
    verdict = check(b, Path.RETRY, now_ms, not_before_ms=nb_ms)
    if verdict is Verdict.ATTEMPTS_EXHAUSTED and env.next_action is NextAction.ESCALATE:
        # The table already wrote this envelope, with the failure's own code as its reason.
        return escalate(a.base(env.code), env, policy)
    if not verdict.ok:
        esc = refused(verdict, a.ref, a.tool.name, a.call_id)
        return escalate(a.base(verdict.value), esc, policy)
    due = cap_retry(b, jittered_due(nb_ms, now_ms, a.tool.options.jitter, rng), nb_ms)
    return a.base(env.code).to(
        State.WAITING_RETRY, envelope=env, due_ms=due, set={"retry_due": str(due)}
    )


@dataclass(frozen=True)
class Uncertain:
    """An attempt whose outcome is unknown: what verification needs to start."""

    ref: str
    tool: Tool[Any]
    call_id: str
    attempt: int
    vcheck: int


def enter_verifying(
    u: Uncertain,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    *,
    base: Guard,
    env: ToolError | None = None,
) -> Transition:
    """An attempt's outcome is unknown: verify it before anything else (invariant 2).

    Without a verifier nothing can settle it, so it escalates at once, with an
    envelope that says so (``OUTCOME_UNVERIFIABLE``, the cause as its reason).
    """
    tool = u.tool
    if tool.verify_fn is None:
        esc = unverifiable_envelope(u.ref, tool.name, u.call_id, reason=base.code)
        return escalate(base, esc, policy, ("unknown", "escalated", "no_verifier"))
    env = env or unknown_envelope(u.ref, tool.name, u.call_id, tool.verification_tool)
    nxt = u.vcheck + 1
    window_end = now_ms + int(tool.options.consistency_window * 1000)
    return base.to(
        State.VERIFYING,
        envelope=env,
        set={
            "uncertain_at": str(now_ms),
            "vcheck": str(nxt),
            "vfail": "0",
            # what the pages show; verified_not_found reads the tool's window itself
            "vwindow": str(window_end),
        },
        due_ms=now_ms + policy.unclaimed_after_ms,
        push=messages.verify(u.ref, u.attempt, nxt),
        stats=("unknown",),
    )


# ---------------------------------------------------------------- verification verdicts

#: A check's ``detail`` when "not found" came before the consistency window passed.
TOO_EARLY = "TOO_EARLY"
#: A check's ``result`` when the verifier raised.
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Check(Claimed):
    """A verification check a worker claimed."""

    vcheck: int
    vfail: int
    uncertain_at_ms: int
    holder: str

    def base(self, code: str | None = None, delete: tuple[str, ...] = VLEASE) -> Guard:
        """The guard of every verdict on this check: still ours, still verifying."""
        return Guard(
            ref=self.ref,
            states=(State.VERIFYING,),
            expect={"verifying": {"vcheck": str(self.vcheck), "vholder": self.holder}},
            by=self.holder,
            code=code,
            delete=delete,
        )


def check_note(
    c: Check, result: str, detail: str = "", next_ms: int | None = None
) -> dict[str, str]:
    """The words a check's verdict adds to its history entry (:class:`Transition` ``note``):
    which check, what it found (``found``, ``not_found``, ``unavailable``), the
    verifier's safe detail, and when the next check is due, if one is."""
    note = {"check": str(c.vcheck), "result": result}
    if detail:
        note["detail"] = detail
    if next_ms is not None:
        note["next"] = str(next_ms)
    return note


def verified_found(c: Check, result: Any, now_ms: int, policy: Policy) -> Transition:
    """The verifier found the write. A result JSON cannot hold (an object, a lone
    surrogate) is the verifier's failure: else the check raised past its task and
    the operation sat in ``verifying`` with nothing recorded."""
    try:
        env = success_envelope(
            c.ref,
            c.tool.name,
            c.call_id,
            result,
            ms_to_dt(now_ms),
            evidence_ref=f"verification:{c.tool.verification_tool}",
            max_bytes=policy.max_result_bytes,
        )
    except ResultTooLarge:
        return verifier_failed(c, now_ms, policy, "result_too_large")
    except (TypeError, ValueError):
        return verifier_failed(c, now_ms, policy, "result_not_json")
    guard = c.base("VERIFIED_COMMITTED", delete=(*VLEASE, *LEASE))
    note = check_note(c, "found")
    return terminal(
        guard.to(State.SUCCEEDED, envelope=env, stats=("succeeded", "verify_found"), note=note),
        policy,
    )


def verified_not_found(c: Check, now_ms: int, policy: Policy, messages: Messages) -> Transition:
    window_end = c.uncertain_at_ms + int(c.tool.options.consistency_window * 1000)
    if now_ms < window_end:
        # Too early to believe "not found": look again when the window has passed.
        return c.base().to(
            State.VERIFYING,
            quiet=True,
            due_ms=window_end,
            stats=("verify_recheck",),
            note=check_note(c, "not_found", TOO_EARLY, window_end),
        )
    verdict = check(c.budget(), Path.NOT_FOUND, now_ms)
    if not verdict.ok:
        t = escalate(
            c.base(verdict.value),
            refused(verdict, c.ref, c.tool.name, c.call_id),
            policy,
            ("verify_not_found", "escalated"),
        )
        return replace(t, note=check_note(c, "not_found", verdict.value))
    t = next_attempt(
        c.base("VERIFIED_NOT_COMMITTED"),
        c,
        now_ms,
        policy,
        messages,
        set={"repubs": "0"},
        stats=("verify_not_found",),
    )
    return replace(t, note=check_note(c, "not_found"))


def verifier_failed(c: Check, now_ms: int, policy: Policy, detail: str = "") -> Transition:
    """The verifier raised (``detail``: its safe words, :func:`toolq.core.errors.safe_words`):
    check again after a backoff, or escalate once ``verify_checks`` checks failed."""
    failures = c.vfail + 1
    if failures >= c.tool.options.verify_checks:
        code = "VERIFICATION_UNAVAILABLE"
        t = escalate(
            c.base(code),
            escalation_envelope(code, c.ref, c.tool.name, c.call_id),
            policy,
            ("verify_escalated", "escalated"),
        )
        return replace(
            t, set={**t.set, "vfail": str(failures)}, note=check_note(c, UNAVAILABLE, detail)
        )
    due = now_ms + verify_backoff_ms(c.tool.options.verify_backoff, failures)
    return c.base().to(
        State.VERIFYING,
        quiet=True,
        due_ms=due,
        set={"vfail": str(failures)},
        stats=("verify_failed",),
        note=check_note(c, UNAVAILABLE, detail, due),
    )


# ---------------------------------------------------------------- a lost worker


@dataclass(frozen=True)
class Lost(Budgeted):
    """A running attempt whose worker is gone: its lease expired (the scheduler's
    sweep) or its holder died (a redelivery). ``expect``/``by`` guard the transition."""

    ref: str
    #: None when the tool is not registered in the deciding process.
    tool: Tool[Any] | None
    tool_name: str
    call_id: str
    attempt: int
    max_attempts: int
    deadline_ms: int
    vcheck: int
    expect: dict[str, dict[str, str]]
    by: str


def lease_lost(lost: Lost, now_ms: int, policy: Policy, messages: Messages) -> Transition:
    """A running attempt lost its worker: a write's outcome is unknown, a read runs again."""
    base = Guard(
        ref=lost.ref,
        states=(State.RUNNING,),
        expect=lost.expect,
        by=lost.by,
        code="LEASE_EXPIRED",
        delete=LEASE,
    )
    stats = ("lease_lost", "escalated")
    tool = lost.tool
    if tool is None:
        # Whether it writes, and how to verify it, are unknown here: a person must check.
        env = unverifiable_envelope(lost.ref, lost.tool_name, lost.call_id, reason="LEASE_EXPIRED")
        return escalate(base, env, policy, stats)
    if tool.writes:
        u = Uncertain(lost.ref, tool, lost.call_id, lost.attempt, lost.vcheck)
        t = enter_verifying(u, now_ms, policy, messages, base=base)
        t.stats = ("lease_lost", *t.stats)
        return t
    verdict = check(lost.budget(), Path.LEASE_LOST, now_ms)
    if not verdict.ok:
        env = refused(verdict, lost.ref, lost.tool_name, lost.call_id)
        return escalate(replace(base, code=verdict.value), env, policy, stats)
    return next_attempt(base, lost, now_ms, policy, messages, stats=("lease_lost",))
