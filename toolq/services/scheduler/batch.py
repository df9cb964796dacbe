"""What one scheduler round took, decided and did (plain records, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from toolq.decisions.recovery.transition import Transition


@dataclass
class TickStats:
    taken: int = 0
    applied: int = 0
    refused: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    #: publish time minus due time (ms) of each dispatch/republish/verify
    lags_ms: list[int] = field(default_factory=list)
    #: (tool, state left, ms spent in it) for operations moved out of pending recovery
    recovered: list[tuple[str, str, int]] = field(default_factory=list)


@dataclass
class Batch:
    """One batch taken and decided, not yet applied."""

    now: int
    stats: TickStats
    transitions: list[Transition] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    left: list[tuple[str, str, int] | None] = field(default_factory=list)
    #: Tracing on: (tool, stored trace context, the operation's age in ms) per transition.
    traced: list[tuple[str, str, int]] = field(default_factory=list)
    #: A full batch was due somewhere (more is due right now).
    full: bool = False


class Rounds(Protocol):
    """What a scheduler's share (:mod:`toolq.services.scheduler.share`) asks of the scheduler
    while it keeps up with a backlog."""

    batch: int
    hold_ms: int

    def now_ms(self) -> int: ...

    def decide(self, rows: list[dict[str, str]], now: int) -> Batch: ...

    def account(self, batch: Batch, results: list[str]) -> TickStats: ...

    def commit(self, batch: Batch) -> TickStats: ...

    def heartbeat(self) -> None: ...

    def heartbeat_every_s(self, seconds: float) -> None: ...

    def stopping(self) -> bool: ...
