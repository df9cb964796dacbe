"""The attempts-and-deadline budget: one check, in one order, for every path (pure).

Every path that may start an attempt of an operation asks :func:`check`
first, with the operation's :class:`Budget` and the clock; a refusal ends the
operation ``escalated`` with the verdict as its code (invariant 6).

The checks, in this order (the first that fails names the verdict):

1. the deadline has passed (``now > deadline``)        -> DEADLINE_EXCEEDED
2. no attempt is left for what the path starts          -> ATTEMPTS_EXHAUSTED
3. a delayed retry would start after the deadline        -> RETRY_BEYOND_DEADLINE

What each path starts (:data:`NEW_ATTEMPT`):

============== ============================================ =================
path           who asks                                     starts
============== ============================================ =================
SUBMIT         a client enqueues a call                     attempt 1
CLAIM          a worker, after its claim, before the tool   the claimed one
DISPATCH       the scheduler, waiting_retry -> queued       a new attempt
REPUBLISH      the scheduler, queued and unclaimed          the same attempt
APPROVE        an operator approves                         a new attempt
PROVIDE_INPUT  an operator supplies changed arguments       a new attempt
LEASE_LOST     a read whose worker is gone runs again       a new attempt
NOT_FOUND      verification found no write: re-queue        a new attempt
RETRY          a failure asks for a retry at not_before     a new attempt
============== ============================================ =================

Verification is not an attempt: a write whose outcome is unknown is verified
whatever its budget says (invariant 2); only the re-queue after "not found"
is budgeted. An attempt already running is never cut short by its deadline;
the deadline bounds when attempts may *start*.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Path(StrEnum):
    """Where a budget check is made (see the module's table)."""

    SUBMIT = "submit"
    CLAIM = "claim"
    DISPATCH = "dispatch"
    REPUBLISH = "republish"
    APPROVE = "approve"
    PROVIDE_INPUT = "provide_input"
    LEASE_LOST = "lease_lost"
    NOT_FOUND = "not_found"
    RETRY = "retry"


#: Paths whose attempt is not counted yet: they need one more than ``attempt``.
#: CLAIM and REPUBLISH serve the attempt the record already counts.
NEW_ATTEMPT = frozenset(
    {
        Path.SUBMIT,
        Path.DISPATCH,
        Path.APPROVE,
        Path.PROVIDE_INPUT,
        Path.LEASE_LOST,
        Path.NOT_FOUND,
        Path.RETRY,
    }
)


class Verdict(StrEnum):
    """The answer; every value but ``GO`` is the code the operation escalates with."""

    GO = "GO"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    RETRY_BEYOND_DEADLINE = "RETRY_BEYOND_DEADLINE"

    @property
    def ok(self) -> bool:
        return self is Verdict.GO


@dataclass(frozen=True)
class Budget:
    """An operation's budget as its record holds it."""

    #: Attempts counted so far (the record's ``attempt``; 0 before the first).
    attempt: int
    max_attempts: int
    #: Absolute, in ms since the epoch; 0 means none.
    deadline_ms: int = 0

    def expired(self, now_ms: int) -> bool:
        return bool(self.deadline_ms) and now_ms > self.deadline_ms


class Budgeted:
    """A record that carries an operation's budget fields: its :meth:`budget`."""

    attempt: int
    max_attempts: int
    deadline_ms: int

    def budget(self) -> Budget:
        return Budget(self.attempt, self.max_attempts, self.deadline_ms)


def attempts_remaining(attempt: int, max_attempts: int) -> int:
    """Attempts left in the budget after ``attempt`` dispatches."""
    return max(0, max_attempts - attempt)


def check(b: Budget, path: Path, now_ms: int, *, not_before_ms: int | None = None) -> Verdict:
    """May ``path`` start its attempt at ``now_ms``? ``not_before_ms`` is a retry's start."""
    if b.expired(now_ms):
        return Verdict.DEADLINE_EXCEEDED
    needed = b.attempt + (1 if path in NEW_ATTEMPT else 0)
    if needed > b.max_attempts:
        return Verdict.ATTEMPTS_EXHAUSTED
    if not_before_ms is not None and b.expired(not_before_ms):
        return Verdict.RETRY_BEYOND_DEADLINE
    return Verdict.GO


def wake_by(b: Budget, due_ms: int) -> int:
    """``due_ms``, but no later than just past the deadline.

    The scheduler looks at an operation when its due time comes; capping it
    makes a queued operation's expiry seen when it happens, not a republish
    backoff (up to an hour) later.
    """
    if not b.deadline_ms:
        return due_ms
    return min(due_ms, b.deadline_ms + 1)


def cap_retry(b: Budget, due_ms: int, not_before_ms: int) -> int:
    """A retry's jittered dispatch time, kept within the deadline when ``not_before`` is.

    Jitter spreads retries out; it must not be what pushes one past the deadline.
    """
    if not b.deadline_ms or due_ms <= b.deadline_ms:
        return due_ms
    return max(not_before_ms, b.deadline_ms)
