"""Republishing in outbox mode (issue 18), as tables: the broker's queue heads cannot
be read (RabbitMQ's cannot at all), so the scheduler decides from the outbox's oldest
entry and each queue's depth (:func:`toolq.decisions.recovery.policy.on_its_way`).

A message still in the outbox is not lost (a relay is down or behind); an empty
queue does not hold it; a queue that holds messages, or did not answer, may, for
``OPAQUE_PATIENCE`` unclaimed timeouts. A wrong "lost" costs a copy the claim
refuses; a wrong "on its way" costs that long.
"""

from __future__ import annotations

import pytest

from toolq.core.states import State
from toolq.decisions.recovery import policy
from toolq.decisions.recovery.policy import (
    OPAQUE_PATIENCE,
    OUTBOX_CLOCK_SLACK_MS,
    Action,
    Queues,
    Snapshot,
    decide,
    on_its_way,
)

NOW = 10_000_000
UNCLAIMED = 5_000
T = policy.Timeouts(
    unclaimed_after_ms=UNCLAIMED, approval_timeout_ms=60_000, input_timeout_ms=60_000
)
PATIENCE = OPAQUE_PATIENCE * UNCLAIMED
PUBLISHED = NOW - UNCLAIMED  # came due for the first time


def q(depth: int | None, oldest_outbox: int | None = None) -> Queues:
    return Queues(
        opaque=True, calls_depth=depth, verify_depth=depth, oldest_outbox_ms=oldest_outbox
    )


@pytest.mark.parametrize(
    ("published", "queues", "on_way"),
    [
        # the outbox is empty, the queue too: the message is nowhere, lost
        (PUBLISHED, q(0), False),
        # the outbox's oldest entry is older than the message: it may be in the outbox
        (PUBLISHED, q(0, oldest_outbox=PUBLISHED - 1), True),
        (PUBLISHED, q(0, oldest_outbox=PUBLISHED), True),
        # ... however long ago: a relay down keeps it there, and it is not lost
        (NOW - 100 * PATIENCE, q(0, oldest_outbox=NOW - 200 * PATIENCE), True),
        # the oldest entry was added after the message: the message has left the outbox
        (PUBLISHED, q(0, oldest_outbox=PUBLISHED + OUTBOX_CLOCK_SLACK_MS + 1), False),
        # within the clock slack (the caller's clock dates the message, the server's the entry)
        (PUBLISHED, q(0, oldest_outbox=PUBLISHED + OUTBOX_CLOCK_SLACK_MS), True),
        # a queue that holds messages may hold this one, for a while
        (PUBLISHED, q(3), True),
        (NOW - PATIENCE + 1, q(3), True),
        (NOW - PATIENCE, q(3), False),
        # a broker that did not answer: the same patience, not a republish storm
        (PUBLISHED, q(None), True),
        (NOW - PATIENCE, q(None), False),
    ],
)
def test_a_message_may_be_on_its_way(published: int, queues: Queues, on_way: bool) -> None:
    assert on_its_way(published, NOW, UNCLAIMED, queues, queues.calls_depth) is on_way


def snap(state: State, published: int, **extra: int) -> Snapshot:
    return Snapshot(
        ref="op/1", state=state, tool="t", attempt=1, max_attempts=5,
        deadline_ms=NOW + 3_600_000, lease_until_ms=0, entered_ms=published,
        vlease_until_ms=0, vholder="", vcheck=1, retry_due_ms=0, repubs=0, rev=2,
        published_ms=published, **extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "queues", "action"),
    [
        (State.QUEUED, q(0), Action.REPUBLISH),
        (State.QUEUED, q(0, oldest_outbox=PUBLISHED - 10), Action.RESCHEDULE),
        (State.QUEUED, q(7), Action.RESCHEDULE),
        (State.QUEUED, q(None), Action.RESCHEDULE),
        # a verification check published and not taken: the same reading of the verify queue
        (State.VERIFYING, q(0), Action.VERIFY),
        (State.VERIFYING, q(0, oldest_outbox=PUBLISHED), Action.RESCHEDULE),
        (State.VERIFYING, q(2), Action.RESCHEDULE),
        # with the heads readable (no broker URL), the head rules as before: an empty
        # queue (None) holds nothing back
        (State.QUEUED, Queues(), Action.REPUBLISH),
        (State.QUEUED, Queues(oldest_call_ms=PUBLISHED), Action.RESCHEDULE),
    ],
)
def test_decide_in_outbox_mode(state: State, queues: Queues, action: Action) -> None:
    assert decide(snap(state, PUBLISHED), NOW, T, queues).action is action


def test_the_verify_queue_is_read_for_checks_and_the_calls_queue_for_runs() -> None:
    # Given a calls queue that holds messages and an empty verify queue
    queues = Queues(opaque=True, calls_depth=9, verify_depth=0)
    # Then a queued run waits, and an outstanding check is published again
    assert decide(snap(State.QUEUED, PUBLISHED), NOW, T, queues).action is Action.RESCHEDULE
    assert decide(snap(State.VERIFYING, PUBLISHED), NOW, T, queues).action is Action.VERIFY
