"""When a worker's lease keeper sends its next renewal: one period after the last was
sent (:func:`until_next`), so a slow reply does not leave the lease to run out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from itertools import pairwise

import pytest
import redis

from toolq.process import logs
from toolq.services.tasks.leases import LeaseKeeper, RenewalWord, until_next
from toolq.services.tasks.run_aio import AsyncLeaseKeeper

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


class _Away:
    """A ledger whose server is away for ``away`` renewals and ``ping_away`` pings."""

    def __init__(self, away: int, ping_away: int) -> None:
        self.away, self.ping_away = away, ping_away
        self.pings = 0
        self.redis = self

    def renew(self, now_ms: int, lease_ms: int, held: list[object]) -> list[str]:
        if self.away:
            self.away -= 1
            raise redis.ConnectionError("refused")
        return []

    def ping(self) -> bool:
        self.pings += 1
        if self.ping_away:
            self.ping_away -= 1
            raise redis.ConnectionError("refused")
        return True


class _Periods:
    """The keeper's stop event: runs ``steps`` (one before each period), then stops."""

    def __init__(self, clock: _Clock, steps: list[Callable[[], None]]) -> None:
        self.clock, self.steps = clock, steps

    def wait(self, timeout: float) -> bool:
        self.clock.now += timeout
        if not self.steps:
            return True
        self.steps.pop(0)()
        return False

    def set(self) -> None:
        pass


def test_an_outage_that_ends_with_nothing_held_says_back_and_the_next_one_is_said_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a keeper holding one call while the server is away (two renewals fail)
    clock = _Clock()
    ledger = _Away(away=2, ping_away=1)
    keeper = LeaseKeeper(ledger, 15_000, clock, renew_every=EVERY, ticks=clock)  # type: ignore[arg-type]
    key = ("op/1", 1, "run", "holder:1")

    def hold() -> None:
        keeper._held[key] = 1

    def release() -> None:
        keeper._held.clear()

    def away_again() -> None:
        ledger.away = 1
        hold()

    def nothing() -> None:
        pass

    keeper._stop = _Periods(  # type: ignore[assignment]
        clock,
        [
            hold,  # a period with the call held: the renewal fails
            nothing,  # the back-off wait after it
            release,  # the call ended (given back) while the server was away: no answer
            nothing,  # a period with nothing held: the server answers the ping
            nothing,  # nothing held, nothing failing: nothing sent
            away_again,  # a new outage, a new call held
            nothing,
            release,
        ],
    )

    # When the keeper runs through those periods
    with caplog.at_level(logging.WARNING, logger="toolq.leases"):
        keeper._loop()

    # Then the end of the first outage is said though nothing was held then (the
    # server answered the keeper's ping), and the second outage is said again
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "lease renewals failing (ConnectionError); retrying",
        "lease renewals back",
        "lease renewals failing (ConnectionError); retrying",
        "lease renewals back",
    ]
    assert ledger.pings == 3  # only while failing with nothing held, not every period


def test_the_asyncio_keeper_is_about_no_operation_though_a_call_started_it() -> None:
    # Given an asyncio-pool keeper started by a call's first lease (inside its log context)
    seen: list[str] = []

    class Ledger:
        async def renew(self, now_ms: int, lease_ms: int, held: list[object]) -> list[str]:
            seen.append(logs._REF.get())  # what its log lines would carry as operation_ref
            raise redis.ConnectionError("refused")

        async def ping(self) -> None:
            seen.append(logs._REF.get())

    async def run() -> None:
        keeper = AsyncLeaseKeeper(Ledger(), 15_000, time.time, renew_every=0.01)  # type: ignore[arg-type]
        with logs.about("op/started-it"):
            holder = keeper.new_holder()
            with keeper.hold("op/started-it", 1, "run", holder):
                while not seen:
                    await asyncio.sleep(0.01)
        await keeper.stop()

    asyncio.run(run())

    # Then its renewals (and their warnings) carry no operation_ref, not that call's
    assert seen and set(seen) == {""}


def test_the_asyncio_keeper_says_back_after_an_outage_that_ends_with_nothing_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The asyncio keeper's side of the outage above (RenewalWord's idle ping, awaited)
    class Ledger:
        def __init__(self) -> None:
            self.away, self.ping_away, self.pings = 2, 1, 0
            self.all_failed, self.answered, self.renewed = (asyncio.Event() for _ in range(3))

        async def renew(self, now_ms: int, lease_ms: int, held: list[object]) -> list[str]:
            if self.away:
                self.away -= 1
                if not self.away:
                    self.all_failed.set()
                raise redis.ConnectionError("refused")
            self.renewed.set()
            return []

        async def ping(self) -> bool:
            self.pings += 1
            if self.ping_away:
                self.ping_away -= 1
                raise redis.ConnectionError("refused")
            self.answered.set()
            return True

    ledger = Ledger()

    async def run() -> None:
        keeper = AsyncLeaseKeeper(ledger, 15_000, time.time, renew_every=0.001)  # type: ignore[arg-type]
        # Given a call held while the server is away (two renewals fail)
        with keeper.hold("op/1", 1, "run", keeper.new_holder()):
            await ledger.all_failed.wait()
        # When the call ends while it is still away, and the server answers later
        await ledger.answered.wait()
        # and a second outage begins with a new call held, and ends
        ledger.away = 1
        ledger.all_failed.clear()
        with keeper.hold("op/2", 1, "run", keeper.new_holder()):
            await ledger.all_failed.wait()
            await ledger.renewed.wait()
        await keeper.stop()

    with caplog.at_level(logging.WARNING, logger="toolq.leases"):
        asyncio.run(run())

    # Then the first outage's end is said though nothing was held (the ping's answer),
    # the second outage is said again, and pings went only while failing with nothing held
    said = [r.getMessage() for r in caplog.records if r.name == "toolq.leases"]
    assert said == [
        "lease renewals failing (ConnectionError); retrying",
        "lease renewals back",
        "lease renewals failing (ConnectionError); retrying",
        "lease renewals back",
    ]
    assert ledger.pings == 2


class _Broken(_Ledger):
    """A renewal that raises what no one expected (a bug, not the server away) once."""

    def renew(self, now_ms: int, lease_ms: int, held: list[object]) -> list[str]:
        if len(self.sent) == 1:
            self.sent.append(self.clock.now)
            self.replies.pop(0)
            raise KeyError("unexpected")
        return super().renew(now_ms, lease_ms, held)


def test_the_keeper_goes_on_renewing_after_an_unexpected_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a keeper holding a call, whose second renewal raises an unexpected error
    clock = _Clock()
    ledger = _Broken(clock, [0.01, 0.01, 0.01, 0.01])
    keeper = LeaseKeeper(ledger, 15_000, clock, renew_every=EVERY, ticks=clock)  # type: ignore[arg-type]
    keeper._held[("op/1", 1, "run", "holder:1")] = 1
    keeper._stop = _Stop(clock, ledger)  # type: ignore[assignment]

    # When it runs until the server has answered every renewal
    with caplog.at_level(logging.ERROR, logger="toolq.leases"):
        keeper._loop()

    # Then the error is logged and the renewals go on (the thread did not end with it,
    # leaving the held call's lease to run out while the call still ran)
    assert len(ledger.sent) == 4
    assert [r.getMessage() for r in caplog.records] == ["lease renewal failed; retrying"]
