"""Operation states and the allowed-transition table (pure)."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_RETRY = "waiting_retry"
    NEEDS_INPUT = "needs_input"
    AWAITING_APPROVAL = "awaiting_approval"
    VERIFYING = "verifying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"


#: States the runtime never moves an operation out of. ``escalated`` is left only by
#: a person's resolution (``toolq.decisions.recovery.operator``: resolved as committed,
#: as not committed, or retried), which :class:`~toolq.decisions.recovery.transition.Transition`
#: enforces by its code; the others have no way out.
TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.ESCALATED, State.CANCELLED})

#: States an operation is created in: queued, or awaiting_approval for a tool
#: that requires approval before its first attempt.
INITIAL = frozenset({State.QUEUED, State.AWAITING_APPROVAL})

#: States in which the operation needs nothing more from the runtime:
#: ``tq.wait`` returns when one is reached.
SETTLED = TERMINAL | {State.NEEDS_INPUT, State.AWAITING_APPROVAL}

#: States an operator watches: the operation is waiting on recovery.
PENDING_RECOVERY = (
    State.WAITING_RETRY,
    State.VERIFYING,
    State.AWAITING_APPROVAL,
    State.NEEDS_INPUT,
)

_S = State
ALLOWED: dict[State, frozenset[State]] = {
    # queued -> queued is a republish of a lost message (same attempt); queued ->
    # waiting_retry a claim its dependency key held back (DEPENDENCY_LIMITED, issue 28:
    # no attempt spent, the scheduler sends the same attempt again).
    _S.QUEUED: frozenset({_S.QUEUED, _S.RUNNING, _S.WAITING_RETRY, _S.CANCELLED, _S.ESCALATED}),
    _S.RUNNING: frozenset(
        {
            _S.SUCCEEDED,
            _S.FAILED,
            _S.WAITING_RETRY,
            _S.NEEDS_INPUT,
            _S.AWAITING_APPROVAL,
            _S.VERIFYING,
            _S.ESCALATED,
            _S.QUEUED,  # a read whose lease expired simply runs again
        }
    ),
    _S.WAITING_RETRY: frozenset({_S.QUEUED, _S.ESCALATED, _S.CANCELLED}),
    _S.NEEDS_INPUT: frozenset({_S.QUEUED, _S.ESCALATED, _S.CANCELLED}),
    _S.AWAITING_APPROVAL: frozenset({_S.QUEUED, _S.ESCALATED, _S.CANCELLED}),
    # verifying -> verifying is a re-check; -> queued only after "not found"
    # once the consistency window has passed (invariant 2).
    _S.VERIFYING: frozenset({_S.VERIFYING, _S.SUCCEEDED, _S.QUEUED, _S.ESCALATED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    # Only an operator's resolution (see TERMINAL): committed, not committed, retried
    # under the same operation_ref.
    _S.ESCALATED: frozenset({_S.SUCCEEDED, _S.FAILED, _S.QUEUED}),
    _S.CANCELLED: frozenset(),
}


def allowed(current: State, target: State) -> bool:
    """Whether ``current -> target`` is a transition of the state machine."""
    return target in ALLOWED[current]


def sources(target: State) -> tuple[State, ...]:
    """Every state from which ``target`` may be entered (the CAS's expected states)."""
    return tuple(s for s in State if target in ALLOWED[s])
