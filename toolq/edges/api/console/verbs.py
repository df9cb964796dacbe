"""The operator's actions: each one's button, the scope it needs, the states it applies
to. The pages show them (:mod:`toolq.edges.api.console.pages`), the action routes do them
(:mod:`toolq.edges.api.console.actions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolq.core.states import State
from toolq.decisions.recovery.operator import CANCELLABLE

#: Refs one bulk action may carry (a page holds at most this many rows).
MAX_BULK = 500


@dataclass(frozen=True)
class Action:
    """An operator action: its button, the scope it needs, the states it applies to."""

    name: str
    label: str
    scope: str
    states: tuple[State, ...]
    #: How a flash message says it was done.
    done: str
    bulk: bool = True


#: Retry now and verify now change when the operation runs next, as approving
#: does: they take the approve scope (the API has no scope of their own).
ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("approve", "Approve", "approve", (State.AWAITING_APPROVAL,), "approved"),
        Action("retry", "Retry now", "approve", (State.WAITING_RETRY,), "due now"),
        Action("verify", "Verify now", "approve", (State.VERIFYING,), "checked now", bulk=False),
        Action("cancel", "Cancel", "cancel", CANCELLABLE, "cancelled"),
    )
}


def actions_for(state: State, bulk: bool = False) -> list[Action]:
    """The actions that apply to ``state`` (and, for bulk, may be done to many at once)."""
    return [a for a in ACTIONS.values() if state in a.states and (a.bulk or not bulk)]
