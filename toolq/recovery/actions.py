"""From a scheduler decision to the transition that carries it out (pure)."""

from __future__ import annotations

from typing import Any

from toolq.fixed import escalation_envelope
from toolq.recovery.budget import wake_by
from toolq.recovery.outcome import Lost, Messages, Policy, escalate, lease_lost
from toolq.recovery.policy import Action, Decision, Snapshot, republish_delay_ms
from toolq.recovery.transition import Guard, Transition
from toolq.states import State
from toolq.tools import Tool


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
    guard = {"*": {"rev": str(s.rev)}}
    by = "scheduler"
    if d.action is Action.DROP:
        return None
    if d.action is Action.RESCHEDULE:
        assert d.at_ms is not None
        return Transition(
            ref=s.ref,
            states=(s.state,),
            to=s.state,
            by=by,
            quiet=True,
            expect=guard,
            due_ms=d.at_ms,
        )
    if d.action is Action.ESCALATE:
        assert d.code is not None
        env = escalation_envelope(d.code, s.ref, s.tool, call_id)
        base = Guard(ref=s.ref, states=(s.state,), by=by, code=d.code, expect=guard)
        return escalate(base, env, policy)
    if d.action is Action.DISPATCH:
        return Transition(
            ref=s.ref,
            states=(State.WAITING_RETRY,),
            to=State.QUEUED,
            by=by,
            expect=guard,
            attempt_incr=1,
            push=messages.run(s.ref, s.attempt + 1),
            due_ms=wake_by(s.budget(), now_ms + policy.unclaimed_after_ms),
            set={"repubs": "0"},
            stats=("dispatched",),
        )
    if d.action is Action.REPUBLISH:
        return Transition(
            ref=s.ref,
            states=(State.QUEUED,),
            to=State.QUEUED,
            by=by,
            quiet=True,
            expect=guard,
            push=messages.run(s.ref, s.attempt),
            # Backs off to an hour, but wakes for the deadline: an expired one escalates.
            due_ms=wake_by(
                s.budget(), now_ms + republish_delay_ms(policy.unclaimed_after_ms, s.repubs + 1)
            ),
            set={"repubs": str(s.repubs + 1)},
            stats=("republished",),
        )
    if d.action is Action.VERIFY:
        nxt = s.vcheck + 1
        return Transition(
            ref=s.ref,
            states=(State.VERIFYING,),
            to=State.VERIFYING,
            by=by,
            quiet=True,
            expect=guard,
            push=messages.verify(s.ref, s.attempt, nxt),
            set={"vcheck": str(nxt)},
            delete=("vholder", "vlease_until"),
            due_ms=now_ms + policy.unclaimed_after_ms,
            stats=("verify_published",),
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
            expect=guard,
            by="scheduler:lease_sweep",
        )
        return lease_lost(lost, now_ms, policy, messages)
    raise AssertionError(d.action)  # pragma: no cover
