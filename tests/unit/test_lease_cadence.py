"""When a worker's lease keeper sends its next renewal (:func:`until_next`)."""

from __future__ import annotations

import pytest

from toolq.services.tasks.leases import until_next

EVERY = 5.0  # a 15 s lease's renewal period


@pytest.mark.parametrize(
    ("reply_after", "waits"),
    [
        (0.01, 4.99),  # a quick renewal: the rest of the period
        (2.0, 3.0),  # a slow one: still one period after it was sent, not after its reply
        (5.0, 0.0),  # a reply a whole period late: the next is sent at once
        (9.0, 0.0),  # a server stalled for most of the lease: at once, never a negative wait
    ],
)
def test_the_next_renewal_is_one_period_after_the_last_was_sent(
    reply_after: float, waits: float
) -> None:
    sent = 1000.0
    assert until_next(sent, EVERY, sent + reply_after) == pytest.approx(waits)


def test_a_stall_shorter_than_the_lease_leaves_the_next_renewal_time_to_land() -> None:
    # Given a 15 s lease renewed every 5 s, and a renewal sent at 0 whose reply took 9 s
    # (the lease it wrote lasts until 15)
    lease, sent, reply = 15.0, 0.0, 9.0
    # Then the next is sent before that lease ends, with 6 s to spare (waiting a whole
    # period after the reply, it went at 14 with 1 s)
    next_sent = reply + until_next(sent, EVERY, reply)
    assert sent + lease - next_sent == pytest.approx(6.0)
