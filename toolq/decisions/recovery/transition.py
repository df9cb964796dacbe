"""One compare-and-set the ledger applies atomically: the record every decision returns,
and the guard its decisions share."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.states import ALLOWED, State


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
    #: Extra words for the history entry this transition appends (``"note"`` in it):
    #: safe words only (codes, counts, allowlisted details), never upstream text. A
    #: quiet update with a note appends an entry (from == to) and announces it to
    #: watchers (the steps channel), never to waiters.
    note: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.note.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError(f"a note holds words: {name!r}: {value!r}")
        for state in self.states:
            if self.quiet and self.to != state:
                raise ValueError(f"a quiet update stays in its state, not {state} -> {self.to}")
            if not self.quiet and self.to not in ALLOWED[state]:
                raise ValueError(f"transition {state} -> {self.to} is not allowed")


@dataclass(frozen=True)
class Guard:
    """What every transition out of one observed state shares: the operation, the
    states and fields it must still hold, who acts and why, the fields the move clears.
    A decision adds where it goes (:meth:`to`)."""

    ref: str
    states: tuple[State, ...]
    by: str
    expect: dict[str, dict[str, str]] = field(default_factory=dict)
    code: str | None = None
    delete: tuple[str, ...] = ()

    def to(
        self,
        to: State,
        *,
        envelope: ToolSuccess | ToolError | None = None,
        attempt_incr: int = 0,
        set: dict[str, str] | None = None,
        due_ms: int | None = None,
        push: tuple[str, str] | None = None,
        stats: tuple[str, ...] = (),
        quiet: bool = False,
        note: dict[str, str] | None = None,
    ) -> Transition:
        return Transition(
            ref=self.ref,
            states=self.states,
            to=to,
            by=self.by,
            code=self.code,
            expect=self.expect,
            attempt_incr=attempt_incr,
            set={} if set is None else set,
            delete=self.delete,
            envelope=envelope,
            due_ms=due_ms,
            push=push,
            stats=stats,
            quiet=quiet,
            note={} if note is None else note,
        )
