"""From a scheduler decision to the transition that carries it out (pure)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from toolq.core.own_envelopes import escalation_envelope
from toolq.core.states import State
from toolq.core.tools import Tool
from toolq.decisions.recovery.budget import wake_by
from toolq.decisions.recovery.moves import Messages, Policy, check_again, escalate, next_attempt
from toolq.decisions.recovery.outcome import Lost, lease_lost
from toolq.decisions.recovery.policy import Action, Decision, Snapshot, republish_delay_ms
from toolq.decisions.recovery.transition import Guard, Transition


def for_decision(
    d: Decision,
    s: Snapshot,
    tool: Tool[Any] | None,
    call_id: str,
    now_ms: int,
    policy: Policy,
    messages: Messages,
) -> Transition | None:
    """The transition for a scheduler decision, CAS-bound to the snapshot's ``rev``."""
    guard = Guard(ref=s.ref, states=(s.state,), by="scheduler", expect={"*": {"rev": str(s.rev)}})
    if d.action is Action.DROP:
        return None
    if d.action is Action.RESCHEDULE:
        assert d.at_ms is not None
        return guard.to(s.state, quiet=True, due_ms=d.at_ms)
    if d.action is Action.ESCALATE:
        assert d.code is not None
        env = escalation_envelope(d.code, s.ref, s.tool, call_id)
        return escalate(replace(guard, code=d.code), env, policy)
    if d.action is Action.DISPATCH:
        waiting = replace(guard, states=(State.WAITING_RETRY,))
        return next_attempt(
            waiting, s, now_ms, policy, messages, set={"repubs": "0"}, stats=("dispatched",)
        )
    if d.action is Action.RELEASE:
        # Held back by its dependency key: the same attempt, sent again (no attempt spent).
        return replace(guard, states=(State.WAITING_RETRY,), delete=("dep_held",)).to(
            State.QUEUED,
            push=messages.run(s.ref, s.attempt),
            due_ms=wake_by(s.budget(), now_ms + policy.unclaimed_after_ms),
            set={"repubs": "0"},
            stats=("dep_released",),
        )
    if d.action is Action.REPUBLISH:
        return replace(guard, states=(State.QUEUED,)).to(
            State.QUEUED,
            quiet=True,
            push=messages.run(s.ref, s.attempt),
            # Backs off to an hour, but wakes for the deadline: an expired one escalates.
            due_ms=wake_by(
                s.budget(), now_ms + republish_delay_ms(policy.unclaimed_after_ms, s.repubs + 1)
            ),
            set={"repubs": str(s.repubs + 1)},
            stats=("republished",),
        )
    if d.action is Action.VERIFY:
        verifying = replace(guard, states=(State.VERIFYING,))
        stats = ("verify_published",)
        return check_again(
            verifying, s.attempt, s.vcheck, now_ms, policy, messages, quiet=True, stats=stats
        )
    if d.action is Action.LEASE_EXPIRED:
        lost = Lost(
            ref=s.ref,
            tool=tool,
            tool_name=s.tool,
            call_id=call_id,
            attempt=s.attempt,
            max_attempts=s.max_attempts,
            deadline_ms=s.deadline_ms,
            vcheck=s.vcheck,
            expect=guard.expect,
            by="scheduler:lease_sweep",
        )
        return lease_lost(lost, now_ms, policy, messages)
    raise AssertionError(d.action)  # pragma: no cover
