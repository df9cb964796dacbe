"""One compare-and-set the ledger applies atomically: the record every decision returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolq.envelope import ToolError, ToolSuccess
from toolq.states import ALLOWED, State


@dataclass
class Transition:
    """One compare-and-set the ledger applies atomically.

    ``states`` are the states the operation must be in; ``expect`` maps a
    state (or ``"*"``) to fields that must hold exactly these values.
    """

    ref: str
    states: tuple[State, ...]
    to: State
    by: str
    code: str | None = None
    expect: dict[str, dict[str, str]] = field(default_factory=dict)
    attempt_incr: int = 0
    set: dict[str, str] = field(default_factory=dict)
    delete: tuple[str, ...] = ()
    envelope: ToolSuccess | ToolError | None = None
    due_ms: int | None = None
    remove_due: bool = False
    push: tuple[str, str] | None = None
    stats: tuple[str, ...] = ()
    ttl: int | None = None
    #: A field update without a state change: no history, no notification.
    #: ``to`` must then be every state in ``states`` (the ledger refuses it otherwise).
    quiet: bool = False

    def __post_init__(self) -> None:
        for state in self.states:
            if self.quiet and self.to != state:
                raise ValueError(f"a quiet update stays in its state, not {state} -> {self.to}")
            if not self.quiet and self.to not in ALLOWED[state]:
                raise ValueError(f"transition {state} -> {self.to} is not allowed")
