"""The moves every recovery decision shares (pure): end an operation (:func:`terminal`,
:func:`escalate`), queue its next attempt, publish its next verification check; and
the settings and message builders they need.

The worker's outcomes (:mod:`~toolq.decisions.recovery.outcome`), the scheduler's actions
(:mod:`~toolq.decisions.recovery.actions`) and the operator's
(:mod:`~toolq.decisions.recovery.operator`)
build their transitions from these, so that each move is written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from toolq.core.envelope import NextAction, ToolError
from toolq.core.own_envelopes import escalation_envelope
from toolq.core.states import State
from toolq.decisions.recovery.budget import Budgeted, Verdict, wake_by
from toolq.decisions.recovery.transition import Guard, Transition

#: The fields of a worker's lease on a run, and on a verification check.
LEASE = ("lease_holder", "lease_until")
VLEASE = ("vholder", "vlease_until")


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
    #: Attempts operators may add to one escalated operation (``recovery.operator_retries``).
    operator_retries: int = 3
    #: The largest result kept (``limits.max_result_bytes``; None: no limit).
    max_result_bytes: int | None = None


def terminal(t: Transition, policy: Policy) -> Transition:
    t.remove_due = True
    t.ttl = policy.retention_s
    return t


def escalate(
    base: Guard,
    env: ToolError,
    policy: Policy,
    stats: tuple[str, ...] = ("escalated",),
) -> Transition:
    """End an operation ``escalated``. Its envelope is what the caller reads from
    then on, so it must say that a person has to act, not that toolq still will."""
    if env.next_action is not NextAction.ESCALATE:
        raise ValueError(f"an escalated operation's envelope says {env.next_action}, not escalate")
    return terminal(base.to(State.ESCALATED, envelope=env, stats=stats), policy)


def refused(verdict: Verdict, ref: str, tool: str, call_id: str) -> ToolError:
    """The envelope of an operation its budget stopped (``verdict`` is not GO)."""
    return escalation_envelope(verdict.value, ref, tool, call_id)


def next_attempt(
    base: Guard,
    of: Budgeted,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    *,
    set: dict[str, str] | None = None,
    stats: tuple[str, ...] = (),
) -> Transition:
    """Queue attempt ``of.attempt + 1``, its message published with the move; the
    scheduler looks again once it should have been claimed (or at the deadline)."""
    return base.to(
        State.QUEUED,
        attempt_incr=1,
        push=messages.run(base.ref, of.attempt + 1),
        due_ms=wake_by(of.budget(), now_ms + policy.unclaimed_after_ms),
        set=set,
        stats=stats,
    )


def check_again(
    base: Guard,
    attempt: int,
    vcheck: int,
    now_ms: int,
    policy: Policy,
    messages: Messages,
    *,
    quiet: bool,
    stats: tuple[str, ...],
) -> Transition:
    """Publish verification check ``vcheck + 1`` now, with the move; the last check's
    lease goes, and the scheduler looks again once the new one should have been claimed."""
    nxt = vcheck + 1
    return replace(base, delete=VLEASE).to(
        State.VERIFYING,
        quiet=quiet,
        push=messages.verify(base.ref, attempt, nxt),
        set={"vcheck": str(nxt)},
        due_ms=now_ms + policy.unclaimed_after_ms,
        stats=stats,
    )
