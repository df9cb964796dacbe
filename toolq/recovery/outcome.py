"""From what happened to the transition the ledger should make (pure).

The worker runs a tool, the verifier looks an operation up, the scheduler
finds something due; each asks this module which transition that means. The
answers are :class:`~toolq.ledger.Transition` values, applied by the ledger as
one compare-and-set each.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolq import errors
from toolq.envelope import (
    CommitState,
    Directive,
    NextAction,
    ToolError,
)
from toolq.fixed import (
    escalation_envelope,
    success_envelope,
    unknown_envelope,
)
from toolq.record import ms_to_dt
from toolq.recovery.policy import (
    attempts_remaining,
    jittered_due,
    verify_backoff_ms,
)
from toolq.recovery.transition import Transition
from toolq.states import State
from toolq.tools import Tool

#: (queue, raw message) for a run or a verification check.
MessageFor = Callable[..., tuple[str, str]]


@dataclass(frozen=True)
class Messages:
    """Builds the broker messages a transition publishes atomically with itself."""

    run: Callable[[str, int], tuple[str, str]]
    verify: Callable[[str, int, int], tuple[str, str]]


@dataclass(frozen=True)
class Policy:
    """Runtime settings the decisions need, in ms."""

    unclaimed_after_ms: int
    approval_timeout_ms: int
    input_timeout_ms: int
    retention_s: int


# ---------------------------------------------------------------- the worker's outcome


@dataclass(frozen=True)
class Attempt:
    """The attempt a worker claimed (from the ledger's claim)."""

    ref: str
    tool: Tool[Any]
    call_id: str
    attempt: int
    max_attempts: int
    deadline_ms: int
    fp: str
    vcheck: int
    holder: str


def terminal(t: Transition, policy: Policy) -> Transition:
    t.remove_due = True
    t.ttl = policy.retention_s
    return t


def after_success(a: Attempt, result: Any, now_ms: int, policy: Policy) -> Transition:
    """A tool returned: the write is committed (a success is accepted even after
    the lease was lost and the operation went to verification: it is proof)."""
    env = success_envelope(a.ref, a.tool.name, a.call_id, result, ms_to_dt(now_ms))
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
            delete=("lease_holder", "lease_until", "vholder", "vlease_until"),
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
    now = ms_to_dt(now_ms)
    remaining = attempts_remaining(a.attempt, a.max_attempts)
    env = errors.error_envelope(
        exc,
        writes=tool.writes,
        operation_ref=a.ref,
        operation=tool.name,
        call_id=a.call_id or None,
        attempts_remaining=remaining,
        now=now,
        verification_tool=tool.verification_tool,
        safe_detail_keys=tool.options.safe_details,
    )
    base: dict[str, Any] = {
        "ref": a.ref,
        "states": (State.RUNNING,),
        "expect": {"running": {"attempt": str(a.attempt), "lease_holder": a.holder}},
        "by": a.holder,
        "code": env.code,
        "delete": ("lease_holder", "lease_until"),
    }
    if env.commit_state is CommitState.UNKNOWN:
        return enter_verifying(
            a.ref,
            tool,
            a.call_id,
            a.vcheck,
            a.attempt,
            now_ms,
            policy,
            messages,
            env=env,
            base=base,
        )
    directive, action = env.retry.directive, env.next_action
    if directive is Directive.AFTER_DELAY:
        assert env.retry.not_before is not None
        nb_ms = int(env.retry.not_before.timestamp() * 1000)
        code = None
        if remaining == 0:
            code = "ATTEMPTS_EXHAUSTED"
        elif a.deadline_ms and nb_ms > a.deadline_ms:
            code = "RETRY_BEYOND_DEADLINE"
        if code is not None:
            esc = escalation_envelope(code, a.ref, tool.name, a.call_id)
            return terminal(
                Transition(
                    **base | {"code": code}, to=State.ESCALATED, envelope=esc, stats=("escalated",)
                ),
                policy,
            )
        due = jittered_due(nb_ms, now_ms, tool.options.jitter, rng)
        return Transition(
            **base, to=State.WAITING_RETRY, envelope=env, due_ms=due, set={"retry_due": str(due)}
        )
    if directive is Directive.AFTER_INPUT_FIX:
        return Transition(
            **base,
            to=State.NEEDS_INPUT,
            envelope=env,
            set={"blocked_fp": a.fp},
            due_ms=now_ms + policy.input_timeout_ms,
        )
    if action is NextAction.REQUEST_APPROVAL:
        return Transition(
            **base,
            to=State.AWAITING_APPROVAL,
            envelope=env,
            due_ms=now_ms + policy.approval_timeout_ms,
        )
    if action is NextAction.ESCALATE:
        return terminal(
            Transition(**base, to=State.ESCALATED, envelope=env, stats=("escalated",)), policy
        )
    return terminal(Transition(**base, to=State.FAILED, envelope=env, stats=("failed",)), policy)


def enter_verifying(
    ref: str,
    tool: Tool[Any],
    call_id: str,
    vcheck: int,
    attempt: int,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    *,
    env: ToolError | None = None,
    base: dict[str, Any],
) -> Transition:
    """An attempt's outcome is unknown: verify it before anything else (invariant 2).

    Without a verifier nothing can settle it, so it escalates at once.
    """
    env = env or unknown_envelope(ref, tool.name, call_id, tool.verification_tool)
    if tool.verify_fn is None:
        return terminal(
            Transition(
                **base,
                to=State.ESCALATED,
                envelope=env,
                stats=("unknown", "escalated", "no_verifier"),
            ),
            policy,
        )
    nxt = vcheck + 1
    return Transition(
        **base,
        to=State.VERIFYING,
        envelope=env,
        set={"uncertain_at": str(now_ms), "vcheck": str(nxt), "vfail": "0"},
        due_ms=now_ms + policy.unclaimed_after_ms,
        push=messages.verify(ref, attempt, nxt),
        stats=("unknown",),
    )


# ---------------------------------------------------------------- verification verdicts


@dataclass(frozen=True)
class Check:
    """A verification check a worker claimed."""

    ref: str
    tool: Tool[Any]
    call_id: str
    attempt: int
    max_attempts: int
    deadline_ms: int
    vcheck: int
    vfail: int
    uncertain_at_ms: int
    holder: str

    def base(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "states": (State.VERIFYING,),
            "expect": {"verifying": {"vcheck": str(self.vcheck), "vholder": self.holder}},
            "by": self.holder,
        }


def verified_found(c: Check, result: Any, now_ms: int, policy: Policy) -> Transition:
    env = success_envelope(
        c.ref,
        c.tool.name,
        c.call_id,
        result,
        ms_to_dt(now_ms),
        evidence_ref=f"verification:{c.tool.verification_tool}",
    )
    return terminal(
        Transition(
            **c.base(),
            to=State.SUCCEEDED,
            envelope=env,
            code="VERIFIED_COMMITTED",
            stats=("succeeded", "verify_found"),
            delete=("vholder", "vlease_until", "lease_holder", "lease_until"),
        ),
        policy,
    )


def verified_not_found(c: Check, now_ms: int, policy: Policy, messages: Messages) -> Transition:
    window_end = c.uncertain_at_ms + int(c.tool.options.consistency_window * 1000)
    if now_ms < window_end:
        # Too early to believe "not found": look again when the window has passed.
        return Transition(
            **c.base(),
            to=State.VERIFYING,
            quiet=True,
            due_ms=window_end,
            delete=("vholder", "vlease_until"),
            stats=("verify_recheck",),
        )
    if attempts_remaining(c.attempt, c.max_attempts) == 0 or (
        c.deadline_ms and now_ms > c.deadline_ms
    ):
        code = (
            "ATTEMPTS_EXHAUSTED"
            if attempts_remaining(c.attempt, c.max_attempts) == 0
            else "DEADLINE_EXCEEDED"
        )
        esc = escalation_envelope(code, c.ref, c.tool.name, c.call_id)
        return terminal(
            Transition(
                **c.base(),
                to=State.ESCALATED,
                envelope=esc,
                code=code,
                stats=("verify_not_found", "escalated"),
                delete=("vholder", "vlease_until"),
            ),
            policy,
        )
    nxt = c.attempt + 1
    return Transition(
        **c.base(),
        to=State.QUEUED,
        code="VERIFIED_NOT_COMMITTED",
        attempt_incr=1,
        push=messages.run(c.ref, nxt),
        due_ms=now_ms + policy.unclaimed_after_ms,
        stats=("verify_not_found",),
        delete=("vholder", "vlease_until"),
        set={"repubs": "0"},
    )


def verifier_failed(c: Check, now_ms: int, policy: Policy) -> Transition:
    failures = c.vfail + 1
    if failures >= c.tool.options.verify_checks:
        esc = escalation_envelope("VERIFICATION_UNAVAILABLE", c.ref, c.tool.name, c.call_id)
        return terminal(
            Transition(
                **c.base(),
                to=State.ESCALATED,
                envelope=esc,
                code="VERIFICATION_UNAVAILABLE",
                stats=("verify_escalated", "escalated"),
                delete=("vholder", "vlease_until"),
            ),
            policy,
        )
    return Transition(
        **c.base(),
        to=State.VERIFYING,
        quiet=True,
        due_ms=now_ms + verify_backoff_ms(c.tool.options.verify_backoff, failures),
        set={"vfail": str(failures)},
        delete=("vholder", "vlease_until"),
        stats=("verify_failed",),
    )


def lease_lost(
    ref: str,
    tool: Tool[Any] | None,
    tool_name: str,
    call_id: str,
    attempt: int,
    max_attempts: int,
    vcheck: int,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    *,
    expect: dict[str, dict[str, str]],
    by: str,
) -> Transition:
    """A running attempt lost its worker: a write's outcome is unknown, a read runs again."""
    base: dict[str, Any] = {
        "ref": ref,
        "states": (State.RUNNING,),
        "expect": expect,
        "by": by,
        "code": "LEASE_EXPIRED",
        "delete": ("lease_holder", "lease_until"),
    }
    if tool is None or tool.writes:
        if tool is None:
            env = unknown_envelope(ref, tool_name, call_id, None)
            return terminal(
                Transition(
                    **base, to=State.ESCALATED, envelope=env, stats=("lease_lost", "escalated")
                ),
                policy,
            )
        t = enter_verifying(
            ref, tool, call_id, vcheck, attempt, now_ms, policy, messages, base=base
        )
        t.stats = ("lease_lost", *t.stats)
        return t
    if attempts_remaining(attempt, max_attempts) == 0:
        esc = escalation_envelope("ATTEMPTS_EXHAUSTED", ref, tool_name, call_id)
        return terminal(
            Transition(**base, to=State.ESCALATED, envelope=esc, stats=("lease_lost", "escalated")),
            policy,
        )
    return Transition(
        **base,
        to=State.QUEUED,
        attempt_incr=1,
        stats=("lease_lost",),
        push=messages.run(ref, attempt + 1),
        due_ms=now_ms + policy.unclaimed_after_ms,
    )
