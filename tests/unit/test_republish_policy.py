"""How old a queue's backlog is, from the messages at its head (pure, as tables).

The scheduler republishes a queued operation only when its message has left
the queue (:func:`toolq.decisions.recovery.policy.decide`); it learns that from the
oldest messages still waiting (:func:`oldest_waiting`). kombu pushes a
redelivered message back at the front, and copies of old messages (a
republish, a redelivery) carry no date of their own: a bound read from one of
them made the chaos run republish 1,354 times in 2,000 operations; stopping at
one held back the republish of a message that really was lost.
"""

from __future__ import annotations

import pytest

from toolq.core.states import State
from toolq.decisions.recovery import policy
from toolq.decisions.recovery.policy import Action, Queues, Waiting, oldest_waiting

NOW = 1_000_000
T = policy.Timeouts(unclaimed_after_ms=5_000, approval_timeout_ms=10_000, input_timeout_ms=20_000)


def fresh(ref: str, published: int, seq: int = 1) -> Waiting:
    """A message its record names as its latest: the only copy of this attempt."""
    return Waiting(ref=ref, seq=seq, record_seq=seq, published_ms=published)


def redelivered(ref: str, seq: int = 1, published: int = 900) -> Waiting:
    """A copy kombu pushed back at the front (a restore, a reject with requeue)."""
    return Waiting(ref, seq, redelivered=True, record_seq=seq, published_ms=published)


#: Copies of unknown age: an attempt published twice (its record dates the latest
#: copy, maybe not this one), an attempt that is over, no record, not toolq's.
REPUBLISHED = Waiting("a", 1, record_seq=1, republished=True, published_ms=900)
OVER = Waiting("o", 1, record_seq=2, published_ms=900)
NO_RECORD = Waiting("g", 1, record_seq=None)
FOREIGN = Waiting(None)


@pytest.mark.parametrize(
    ("head", "bound", "seen"),
    [
        # an empty queue holds nothing back
        ([], None, set()),
        # the first message its record dates: when it was pushed
        ([fresh("a", 100), fresh("b", 200)], 100, {"a", "b"}),
        # redeliveries are put at the front, ahead of older messages: passed over, but waiting
        ([redelivered("r"), fresh("a", 100)], 100, {"r", "a"}),
        # copies of unknown age date nothing: passed over, the next message dates the rest
        ([REPUBLISHED, fresh("b", 100)], 100, {"a", "b"}),
        ([OVER, fresh("b", 100)], 100, {"o", "b"}),
        ([NO_RECORD, fresh("b", 100)], 100, {"g", "b"}),
        ([FOREIGN, fresh("b", 100)], 100, {"b"}),
        (
            [FOREIGN, REPUBLISHED, redelivered("r"), OVER, NO_RECORD, fresh("b", 7)],
            7,
            {"a", "r", "o", "g", "b"},
        ),
        # nothing in sight dates the queue: the age is unknown
        ([REPUBLISHED], 0, {"a"}),
        ([redelivered("r", published=5)], 0, {"r"}),
        ([FOREIGN, OVER, NO_RECORD], 0, {"o", "g"}),
    ],
)
def test_the_backlog_is_dated_by_the_first_message_whose_record_names_it(
    head: list[Waiting], bound: int | None, seen: set[str]
) -> None:
    assert oldest_waiting(head) == (bound, frozenset(seen))


def snap(ref: str, state: State, published: int, vcheck: int = 0) -> policy.Snapshot:
    """A queued or verifying operation whose message (or check) was published at ``published``."""
    return policy.Snapshot(
        ref=ref,
        state=state,
        tool="t",
        attempt=1,
        max_attempts=3,
        deadline_ms=0,
        lease_until_ms=0,
        entered_ms=published,
        vlease_until_ms=0,
        vholder="",
        vcheck=vcheck,
        retry_due_ms=0,
        repubs=0,
        rev=2,
        published_ms=published,
    )


@pytest.mark.parametrize(
    ("head", "ref", "published", "action"),
    [
        # behind a dated message it is still waiting its turn; before it, it left (lost)
        ([fresh("b", 100)], "c", 150, Action.RESCHEDULE),
        ([fresh("b", 100)], "c", 50, Action.REPUBLISH),
        # the cascade issue 14 ended: A was republished at 900 while its first copy
        # (pushed at 0) still waited at the front; dated by A's record, every
        # operation published before 900 was republished, and each republish left
        # another copy to date the queue by. The copy dates nothing now.
        ([REPUBLISHED, fresh("b", 10)], "c", 50, Action.RESCHEDULE),
        # ... and a message that really was lost is still republished behind such a
        # copy: pushed before b, it would be in front of b, where it was not seen
        ([REPUBLISHED, fresh("b", 100)], "c", 50, Action.REPUBLISH),
        ([FOREIGN, OVER, fresh("b", 100)], "c", 50, Action.REPUBLISH),
        # nothing dates the queue: wait until something does
        ([REPUBLISHED], "c", 50, Action.RESCHEDULE),
        # an operation whose message was seen at the head is waiting, whatever the dates
        ([redelivered("c", published=10), fresh("b", 100)], "c", 10, Action.RESCHEDULE),
        ([redelivered("c", published=10), fresh("b", 100)], "d", 10, Action.REPUBLISH),
        ([REPUBLISHED, fresh("b", 100)], "a", 50, Action.RESCHEDULE),
        # an empty queue: the message is gone
        ([], "c", 150, Action.REPUBLISH),
    ],
)
def test_a_queued_operation_is_republished_only_when_its_message_has_left(
    head: list[Waiting], ref: str, published: int, action: Action
) -> None:
    bound, seen = oldest_waiting(head)
    q = Queues(oldest_call_ms=bound, waiting_calls=seen)
    assert policy.decide(snap(ref, State.QUEUED, published), NOW, T, q).action is action


@pytest.mark.parametrize(
    ("seen_at_the_head", "action"),
    [
        # a check seen waiting at the head is not published again
        (True, Action.RESCHEDULE),
        # published before the dated message and not seen: it left the queue
        (False, Action.VERIFY),
    ],
)
def test_a_verification_check_is_published_again_only_when_it_has_left(
    seen_at_the_head: bool, action: Action
) -> None:
    s = snap("v", State.VERIFYING, published=10, vcheck=2)
    head = [redelivered("v", seq=2, published=10), fresh("w", 500)]
    bound, seen = oldest_waiting(head)
    q = Queues(oldest_verify_ms=bound, waiting_verify=seen if seen_at_the_head else frozenset())
    assert policy.decide(s, NOW, T, q).action is action
