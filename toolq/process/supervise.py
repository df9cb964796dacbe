"""When ``toolq up`` restarts a child that exited, and when it gives up on it.

A pure decision on a child's exit times and a clock, apart from the processes
(:mod:`toolq.edges.stack` starts them, ``toolq up`` watches them):

=====================================  ==========================================
exits of this child in the last 60 s   decision
=====================================  ==========================================
1 (this one)                           restart after 0.5 s
2, 3, 4                                restart after 1, 2, 4 s (x2, at most 10 s)
5 or more                              give up on this child: a crash loop
=====================================  ==========================================

An exit older than the window no longer counts: a child that ran a minute is
restarted fast again. The first restart is quick so that a SIGKILLed worker,
scheduler, relay or API is back within about two seconds (its start-up takes
most of that); the backoff keeps a child that cannot start from spinning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Action", "ChildRecord", "Decision", "RestartPolicy"]


class Action(Enum):
    RESTART = "restart"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class Decision:
    action: Action
    #: Seconds to wait before the restart (0 when giving up).
    delay: float
    #: Exits counted in the window, this one included.
    recent: int


@dataclass(frozen=True)
class RestartPolicy:
    first_delay: float = 0.5
    factor: float = 2.0
    max_delay: float = 10.0
    #: This many exits within ``window`` seconds are a crash loop.
    loop_exits: int = 5
    window: float = 60.0

    def decide(self, exits: Sequence[float], now: float) -> Decision:
        """What to do about a child whose exits (monotonic times, the last one just
        now) are ``exits``."""
        recent = sum(1 for t in exits if now - t < self.window)
        recent = max(recent, 1)
        if recent >= self.loop_exits:
            return Decision(Action.GIVE_UP, 0.0, recent)
        delay = min(self.first_delay * self.factor ** (recent - 1), self.max_delay)
        return Decision(Action.RESTART, delay, recent)


@dataclass
class ChildRecord:
    """One child's restarts, as ``toolq up`` records them in its state file and
    ``toolq status`` shows them."""

    name: str
    pid: int | None = None
    #: running | restarting | failed
    state: str = "running"
    restarts: int = 0
    last_exit_code: int | None = None
    #: Wall-clock time of the last exit (what a person reads), None before any.
    last_exit_at: float | None = None
    #: Monotonic times of the exits (what :meth:`RestartPolicy.decide` reads), not recorded.
    exits: list[float] = field(default_factory=list)

    def exited(self, code: int | None, now: float, wall: float) -> None:
        self.exits = [*self.exits[-15:], now]
        self.last_exit_code = code
        self.last_exit_at = wall

    def as_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "last_exit_at": self.last_exit_at,
        }
