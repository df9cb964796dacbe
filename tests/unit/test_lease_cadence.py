"""When a worker's lease keeper sends its next renewal: one period after the last was
sent (:func:`until_next`), so a slow reply does not leave the lease to run out."""

from __future__ import annotations

import logging
from itertools import pairwise

import pytest

from toolq.services.tasks.leases import LeaseKeeper, RenewalWord, until_next

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


class _Clock:
    """Seconds that move only when the test says: a renewal's reply, or a wait."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Ledger:
    """Takes every renewal; each reply takes the next of ``replies`` seconds."""

    def __init__(self, clock: _Clock, replies: list[float]) -> None:
        self.clock, self.replies = clock, replies
        self.sent: list[float] = []  # when each renewal was sent

    def renew(self, now_ms: int, lease_ms: int, held: list[object]) -> list[str]:
        self.sent.append(self.clock.now)
        self.clock.now += self.replies.pop(0)
        return []


class _Stop:
    """The keeper's stop event: each wait passes on the clock; stops once no reply is left."""

    def __init__(self, clock: _Clock, ledger: _Ledger) -> None:
        self.clock, self.ledger = clock, ledger

    def wait(self, timeout: float) -> bool:
        self.clock.now += timeout
        return not self.ledger.replies

    def set(self) -> None:
        pass


def test_a_renewal_whose_reply_took_two_periods_is_followed_before_its_lease_ends() -> None:
    # Given a keeper of a 15 s lease (renewed every 5 s) holding one attempt, on a server
    # whose third reply takes 10 s (a stall)
    clock = _Clock()
    ledger = _Ledger(clock, [0.01, 0.01, 10.0, 0.01, 0.01])
    keeper = LeaseKeeper(ledger, 15_000, clock, renew_every=EVERY, ticks=clock)  # type: ignore[arg-type]
    keeper._held[("op/1", 1, "run", "holder:1")] = 1
    keeper._stop = _Stop(clock, ledger)  # type: ignore[assignment]

    # When it renews until the server has answered them all
    keeper._loop()

    # Then every renewal was sent before the lease the one before it wrote ran out:
    # the one after the stall at once (at 10 s of the 15 s), not a period after it
    # (at 15 s, when the lease had just ended and the sweep could take it)
    sent = ledger.sent
    assert len(sent) == 5
    assert all(b < a + 15.0 for a, b in pairwise(sent))
    assert sent[3] - sent[2] == pytest.approx(10.0)


def test_renewals_say_once_that_they_fail_and_once_that_they_are_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    word = RenewalWord()
    with caplog.at_level(logging.WARNING, logger="toolq.leases"):
        for _ in range(3):
            word.failed(ConnectionError("refused"))
        word.renewed()
        word.renewed()
        word.failed(ConnectionError("refused"))
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "lease renewals failing (ConnectionError); retrying",
        "lease renewals back",
        "lease renewals failing (ConnectionError); retrying",
    ]
