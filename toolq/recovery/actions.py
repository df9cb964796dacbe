"""From a scheduler decision to the transition that carries it out (pure)."""

from __future__ import annotations

from typing import Any

from toolq.fixed import escalation_envelope
from toolq.recovery.outcome import Messages, Policy, lease_lost, terminal
from toolq.recovery.policy import Action, Decision, Snapshot, republish_delay_ms
from toolq.recovery.transition import Transition
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
        return terminal(
            Transition(
                ref=s.ref,
                states=(s.state,),
                to=State.ESCALATED,
                by=by,
                code=d.code,
                expect=guard,
                envelope=env,
                stats=("escalated",),
            ),
            policy,
        )
    if d.action is Action.DISPATCH:
        return Transition(
            ref=s.ref,
            states=(State.WAITING_RETRY,),
            to=State.QUEUED,
            by=by,
            expect=guard,
            attempt_incr=1,
            push=messages.run(s.ref, s.attempt + 1),
            due_ms=now_ms + policy.unclaimed_after_ms,
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
            due_ms=now_ms + republish_delay_ms(policy.unclaimed_after_ms, s.repubs + 1),
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
        return lease_lost(
            s.ref,
            tool,
            s.tool,
            call_id,
            s.attempt,
            s.max_attempts,
            s.vcheck,
            now_ms,
            policy,
            messages,
            expect={"*": {"rev": str(s.rev)}},
            by="scheduler:lease_sweep",
        )
    raise AssertionError(d.action)  # pragma: no cover
