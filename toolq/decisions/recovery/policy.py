"""The scheduler's pure decisions: what is due, with what jitter, what a due
operation needs. Functions of data and an injected clock/random source; no Redis.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from toolq.core.states import State
from toolq.core.tools import Jitter
from toolq.decisions.recovery.budget import Budgeted, Path, check, wake_by


def jittered_due(not_before_ms: int, now_ms: int, jitter: Jitter, rng: random.Random) -> int:
    """When a delayed retry is dispatched: ``not_before`` plus jitter, never earlier.

    A ``not_before`` in the past is due now (plus no jitter beyond the delay, which is 0).
    """
    base = max(not_before_ms, now_ms)
    return base + jitter.extra_ms(base - now_ms, rng)


def republish_delay_ms(unclaimed_after_ms: int, republished: int) -> int:
    """How long to wait before publishing an unclaimed message again (x2 each time, ≤ 1 h)."""
    return int(min(unclaimed_after_ms * (2 ** min(republished, 16)), 3_600_000))


def verify_backoff_ms(backoff_s: float, failures: int) -> int:
    """Delay before re-checking after the verifier failed ``failures`` times (x2, ≤ 5 min)."""
    return int(min(backoff_s * 1000 * (2 ** max(0, failures - 1)), 300_000))


class Action(StrEnum):
    """What a due operation needs."""

    DISPATCH = "dispatch"  # waiting_retry -> queued, a new attempt
    RELEASE = "release"  # waiting_retry (held by its dependency) -> queued, same attempt
    REPUBLISH = "republish"  # queued and unclaimed: publish the same attempt again
    LEASE_EXPIRED = "lease_expired"  # running, lease gone: verify (write) / rerun (read)
    VERIFY = "verify"  # verifying: publish a verification check
    ESCALATE = "escalate"
    RESCHEDULE = "reschedule"  # not due after all: look again at `at_ms`
    DROP = "drop"  # finished: forget the due entry


@dataclass(frozen=True)
class Snapshot(Budgeted):
    """The fields of an operation the scheduler reads (``ledger.scripts.DUE_FIELDS``)."""

    ref: str
    state: State
    tool: str
    attempt: int
    max_attempts: int
    deadline_ms: int
    lease_until_ms: int
    entered_ms: int
    vlease_until_ms: int
    vholder: str
    vcheck: int
    retry_due_ms: int
    repubs: int
    rev: int
    #: when the operation's latest message was pushed, and when a verifier last took one
    published_ms: int = 0
    vclaimed_ms: int = 0
    #: Its dependency key held it back (the reason; "" if not): waiting_retry that
    #: spent no attempt, and whose due time, not ``retry_due``, says when it goes
    #: (a released slot or a lifted pause makes it due sooner).
    dep_held: str = ""

    @classmethod
    def from_row(cls, row: dict[str, str]) -> Snapshot:
        def n(name: str) -> int:
            v = row.get(name)
            if not v:
                return 0
            try:
                return int(v)
            except ValueError:  # a score or a Lua number written as "1.5e+12"
                return int(float(v))

        return cls(
            ref=row["ref"],
            state=State(row["state"]),
            tool=row.get("tool", ""),
            attempt=n("attempt"),
            max_attempts=n("max_attempts"),
            deadline_ms=n("deadline"),
            lease_until_ms=n("lease_until"),
            entered_ms=n("entered"),
            vlease_until_ms=n("vlease_until"),
            vholder=row.get("vholder", ""),
            vcheck=n("vcheck"),
            retry_due_ms=n("retry_due"),
            repubs=n("repubs"),
            rev=n("rev"),
            published_ms=n("published"),
            vclaimed_ms=n("vclaimed"),
            dep_held=row.get("dep_held", ""),
        )


@dataclass(frozen=True)
class Decision:
    action: Action
    code: str | None = None
    at_ms: int | None = None


@dataclass(frozen=True)
class Timeouts:
    unclaimed_after_ms: int
    approval_timeout_ms: int
    input_timeout_ms: int


@dataclass(frozen=True)
class Queues:
    """What the scheduler saw at the head of each queue (:func:`oldest_waiting`).

    ``oldest_*_ms``: no message still waiting in the queue was published before
    this (ms); None when the queue is empty; 0 when the head says nothing (every
    message may still be waiting). Queues are first in, first out: a message
    published earlier has left the queue. If its operation is still unclaimed,
    the message was lost (or sits with a dead worker) and is published again; if
    it was published later, it may simply be waiting its turn behind a backlog.
    ``waiting_*``: refs with a message seen at the head, waiting for sure.
    """

    oldest_call_ms: int | None = None
    oldest_verify_ms: int | None = None
    waiting_calls: frozenset[str] = frozenset()
    waiting_verify: frozenset[str] = frozenset()
    #: Outbox mode: the broker is not the ledger's Redis, and its queues' heads cannot
    #: be read (RabbitMQ's cannot at all). What is known instead: how many messages
    #: each queue holds (``*_depth``: a passive declare; None when the broker did not
    #: answer) and when the oldest entry still in the outbox was added (None: empty).
    opaque: bool = False
    calls_depth: int | None = None
    verify_depth: int | None = None
    oldest_outbox_ms: int | None = None


@dataclass(frozen=True)
class Waiting:
    """One message at the head of a queue, and the record of its operation.

    ``seq`` is what the message carries that the record moves on with each
    message it publishes: the attempt (calls queue) or the check (verify queue);
    ``record_seq`` the record's (None: no record). ``republished``: the record has
    published this attempt more than once (``repubs``), so ``published_ms`` is the
    time of its latest copy, which may not be this one.
    """

    ref: str | None
    seq: int = 0
    redelivered: bool = False
    record_seq: int | None = None
    republished: bool = False
    published_ms: int = 0


def oldest_waiting(head: Sequence[Waiting]) -> tuple[int | None, frozenset[str]]:
    """From the oldest messages of a queue (front first): a lower bound for when the
    oldest one still waiting was published, and the refs seen waiting.

    The bound is read from the first message that kombu did not push back
    (a redelivery is put at the front, ahead of older messages) and whose record
    names it as its latest: then the record's ``published`` is when it was
    pushed. A message of an older attempt, of an attempt published more than
    once, or without a record, may be a copy of any age: it dates nothing, and is
    passed over like a redelivery. Passing over is safe because the bound only
    speaks for messages behind the one that dates it, all pushed after it; those
    in front of it are in the refs seen. Reading the record of whatever message
    came first instead (before issue 14) took a copy's record, republished since,
    for the queue's age, and republished every operation behind it: 1,354
    republishes in 2,000 operations of the chaos run (bench/RESULTS.md,
    "Republishing under backlog"). Stopping at the first copy instead held back
    every republish, a lost message's too, for as long as copies came first
    (after a mass republish: until the whole backlog had drained).
    Nothing in sight dates the queue: the bound is unknown (0).
    """
    if not head:
        return None, frozenset()
    seen = frozenset(w.ref for w in head if w.ref)
    for w in head:
        if not w.redelivered and w.ref and w.record_seq == w.seq and not w.republished:
            return w.published_ms, seen
    return 0, seen


def may_still_be_waiting(published_ms: int, oldest_waiting_ms: int | None) -> bool:
    return oldest_waiting_ms is not None and published_ms >= oldest_waiting_ms


#: Outbox mode, a queue that holds messages: an unclaimed operation is published
#: again only once it has waited this many ``unclaimed_after`` since its message was
#: published. Its message may be anywhere in the backlog (no head to read), and a
#: copy costs a delivery the claim refuses; a lost one costs this long.
OPAQUE_PATIENCE = 10
#: The ledger dates a message with its caller's clock, the outbox entry with the
#: server's: an entry added up to this much before the message's own time may be it.
OUTBOX_CLOCK_SLACK_MS = 1_000


def on_its_way(
    published_ms: int, now_ms: int, unclaimed_after_ms: int, q: Queues, depth: int | None
) -> bool:
    """Outbox mode: may an unclaimed message published at ``published_ms`` still be on
    its way to a worker, in the outbox or in the broker's queue of ``depth`` messages?

    The outbox is first in, first out, like a queue: a message published after its
    oldest entry was added may still be in it, and is not lost whatever the broker
    holds (a relay down keeps it there). Past the outbox: a queue that holds nothing
    does not hold it; one that holds messages (or did not answer) may, for
    :data:`OPAQUE_PATIENCE` times the unclaimed timeout.
    """
    if may_still_be_waiting(published_ms + OUTBOX_CLOCK_SLACK_MS, q.oldest_outbox_ms):
        return True
    if depth == 0:
        return False
    return now_ms - published_ms < OPAQUE_PATIENCE * unclaimed_after_ms


def decide(s: Snapshot, now_ms: int, t: Timeouts, q: Queues = Queues()) -> Decision:
    """What the scheduler does with an operation that came due at ``now_ms``."""
    if s.state in (State.SUCCEEDED, State.FAILED, State.ESCALATED, State.CANCELLED):
        return Decision(Action.DROP)
    if s.state is State.WAITING_RETRY and s.dep_held:
        # Held back by its dependency key: the same attempt goes again (no attempt
        # spent), unless the deadline passed meanwhile.
        verdict = check(s.budget(), Path.REPUBLISH, now_ms)
        if not verdict.ok:
            return Decision(Action.ESCALATE, code=verdict.value)
        return Decision(Action.RELEASE)
    if s.state is State.WAITING_RETRY:
        if s.retry_due_ms > now_ms:
            return Decision(Action.RESCHEDULE, at_ms=s.retry_due_ms)
        verdict = check(s.budget(), Path.DISPATCH, now_ms)
        if not verdict.ok:
            return Decision(Action.ESCALATE, code=verdict.value)
        return Decision(Action.DISPATCH)
    if s.state is State.QUEUED:
        # Checked before the backlog test: an expired message must not run even
        # if it is still waiting its turn (its claim will find it escalated).
        verdict = check(s.budget(), Path.REPUBLISH, now_ms)
        if not verdict.ok:
            return Decision(Action.ESCALATE, code=verdict.value)
        if (
            s.ref in q.waiting_calls
            or may_still_be_waiting(s.published_ms, q.oldest_call_ms)
            or (
                q.opaque
                and on_its_way(s.published_ms, now_ms, t.unclaimed_after_ms, q, q.calls_depth)
            )
        ):
            at = wake_by(s.budget(), now_ms + t.unclaimed_after_ms)
            return Decision(Action.RESCHEDULE, at_ms=at)
        return Decision(Action.REPUBLISH)
    if s.state is State.RUNNING:
        if s.lease_until_ms > now_ms:
            return Decision(Action.RESCHEDULE, at_ms=s.lease_until_ms)
        return Decision(Action.LEASE_EXPIRED)
    if s.state is State.VERIFYING:
        if s.vholder and s.vlease_until_ms > now_ms:
            return Decision(Action.RESCHEDULE, at_ms=s.vlease_until_ms)
        outstanding = s.published_ms > s.vclaimed_ms  # a check published, not yet taken
        waiting = s.ref in q.waiting_verify or may_still_be_waiting(
            s.published_ms, q.oldest_verify_ms
        )
        if q.opaque:
            waiting = on_its_way(s.published_ms, now_ms, t.unclaimed_after_ms, q, q.verify_depth)
        if outstanding and waiting:
            return Decision(Action.RESCHEDULE, at_ms=now_ms + t.unclaimed_after_ms)
        return Decision(Action.VERIFY)
    if s.state is State.AWAITING_APPROVAL:
        if now_ms >= s.entered_ms + t.approval_timeout_ms:
            return Decision(Action.ESCALATE, code="APPROVAL_TIMEOUT")
        return Decision(Action.RESCHEDULE, at_ms=s.entered_ms + t.approval_timeout_ms)
    if s.state is State.NEEDS_INPUT:
        if now_ms >= s.entered_ms + t.input_timeout_ms:
            return Decision(Action.ESCALATE, code="INPUT_TIMEOUT")
        return Decision(Action.RESCHEDULE, at_ms=s.entered_ms + t.input_timeout_ms)
    return Decision(Action.DROP)  # pragma: no cover - every state is handled above


def sleep_seconds(next_due_ms: int | None, now_ms: int, max_sleep: float) -> float:
    """How long the scheduler blocks before looking again (woken earlier by a signal)."""
    if next_due_ms is None:
        return max_sleep
    return max(0.0, min(max_sleep, (next_due_ms - now_ms) / 1000))
