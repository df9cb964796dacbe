"""The wait for a dependency that is away (toolq.process.waiting): the docstring's table, row
by row, then the shells' logging (one line when the wait starts, one when it ends): the
loop's (Waiter) and the request server's (Watch)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from toolq.process.waiting import Outage, OutageLog, Waiter, Watch

# (event, at, expected delay, expected line or None)
WALK: list[tuple[str, float, float | None, str | None]] = [
    ("answered", 100.0, None, None),  # no outage: nothing to say
    ("failed", 101.0, 0.5, "the broker unavailable (OperationalError); retrying every ≤ 2 s"),
    ("failed", 101.5, 1.0, None),
    ("failed", 102.5, 2.0, None),
    ("failed", 104.5, 2.0, None),  # capped
    ("failed", 106.5, 2.0, None),
    ("answered", 142.0, None, "the broker back after 41 s"),
    ("answered", 143.0, None, None),
    ("failed", 150.0, 0.5, "the broker unavailable (OperationalError); retrying every ≤ 2 s"),
    ("answered", 151.0, None, "the broker back after 1 s"),
    # a flap: failing again within cap_s of the answer, briefly, says nothing
    ("failed", 152.0, 0.5, None),
    ("answered", 152.5, None, None),
    # a flap that lasts FLAP_S is an outage of its own: said then, and its end
    ("failed", 153.0, 0.5, None),
    ("failed", 158.0, 1.0, None),
    ("failed", 163.0, 2.0, "the broker unavailable (OperationalError); retrying every ≤ 2 s"),
    ("failed", 165.0, 2.0, None),
    ("answered", 170.0, None, "the broker back after 17 s"),
]


def test_the_table_row_by_row() -> None:
    o = Outage("the broker", "broker")
    for event, at, delay, line in WALK:
        if event == "failed":
            assert o.failed(at, "OperationalError") == (delay, line), (event, at)
            assert o.waiting and o.beat() is not None
        else:
            assert o.answered(at) == line, (event, at)
            assert not o.waiting and o.beat() is None


def test_the_beat_says_what_and_since_when_it_started() -> None:
    o = Outage("the broker", "broker")
    o.failed(1_700_000_000.25, "OSError")
    o.failed(1_700_000_009.0, "OSError")
    assert o.beat() == {"for": "broker", "since": 1_700_000_000_250}


@pytest.mark.parametrize(
    ("why", "line"),
    [
        ("ConnectionError", "the ledger unavailable (ConnectionError); retrying every ≤ 2 s"),
        (
            "AuthenticationError",
            "the ledger unavailable (AuthenticationError: check the user and password in its "
            "URL); retrying every ≤ 2 s",
        ),
    ],
)
def test_a_failure_of_the_process_own_setting_says_what_to_check(why: str, line: str) -> None:
    assert Outage("the ledger").failed(1.0, why) == (0.5, line)


@pytest.mark.parametrize(
    ("first", "cap", "delays"), [(0.5, 2.0, [0.5, 1, 2, 2]), (1, 5, [1, 2, 4, 5, 5])]
)
def test_the_delay_doubles_up_to_the_cap(first: float, cap: float, delays: list[float]) -> None:
    o = Outage("x", first_s=first, cap_s=cap)
    assert [o.failed(float(i), "E")[0] for i in range(len(delays))] == delays


def test_the_shell_logs_one_line_per_change(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    stop.set()  # no sleeping in a unit test
    now = [0.0]
    w = Waiter(
        Outage("the ledger's server", "ledger"),
        logging.getLogger("t"),
        clock=lambda: now[0],
        stop=stop,
    )
    caplog.set_level(logging.INFO, logger="t")
    for _ in range(50):
        now[0] += 1
        w.failed(ConnectionError("refused"))
    now[0] = 60.0
    w.answered()
    w.answered()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "t"]
    assert said == [
        ("WARNING", "the ledger's server unavailable (ConnectionError); retrying every ≤ 2 s"),
        ("INFO", "the ledger's server back after 59 s"),
    ]


def test_a_failure_that_says_more_than_its_class_gets_the_waiter_advice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a waiter whose advice reads the exception (a rediss:// URL's handshake)
    stop = threading.Event()
    stop.set()
    w = Waiter(
        Outage("the ledger's server", "ledger"),
        logging.getLogger("t.advice"),
        stop=stop,
        advice=lambda exc: "check TLS" if "connecting" in str(exc) else "",
    )
    caplog.set_level(logging.INFO, logger="t.advice")
    # When one outage fails that way, and a later one otherwise
    w.failed(TimeoutError("Timeout connecting to server"))
    w.failed(TimeoutError("Timeout connecting to server"))
    w.answered()
    w.outage.ended = -100.0  # the next is an outage of its own, not a flap
    w.failed(ConnectionError("refused"))
    said = [r.getMessage() for r in caplog.records if r.name == "t.advice"]
    # Then the first says the advice, once; the second, which has none, says only its class
    assert said[0] == (
        "the ledger's server unavailable (TimeoutError: check TLS); retrying every ≤ 2 s"
    )
    assert said[2] == "the ledger's server unavailable (ConnectionError); retrying every ≤ 2 s"
    assert len(said) == 3, said


def test_an_unexpected_error_is_logged_once_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    stop.set()
    w = Waiter(Outage("relay rounds", down="failing"), logging.getLogger("t"), stop=stop)
    for _ in range(3):
        try:
            raise KeyError("boom")
        except KeyError as exc:
            w.failed(exc, traceback=True)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "t"]
    assert len(errors) == 1 and errors[0].exc_info is not None


def _watch(probe_fails: int, now: list[float]) -> tuple[Watch, list[float]]:
    """A Watch whose probe fails ``probe_fails`` times, then answers; ``now`` its clock."""
    probed: list[float] = []

    async def probe() -> None:
        probed.append(now[0])
        if len(probed) <= probe_fails:
            raise ConnectionError("refused")

    outage = Outage("queue server", "ledger", first_s=0.001, cap_s=0.004, meanwhile="503s")
    return Watch(outage, probe, logging.getLogger("t"), clock=lambda: now[0]), probed


def test_requests_failing_in_an_outage_say_it_once_and_the_probe_says_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="t")
    now = [100.0]
    watch, probed = _watch(probe_fails=3, now=now)

    async def scenario() -> None:
        for _ in range(200):  # requests failing, faster than the probe's delays
            watch.failed(ConnectionError("refused"), "cannot reach the server at 127.0.0.1:1")
        assert watch.waiting
        now[0] = 130.0
        while watch.waiting:
            await asyncio.sleep(0.001)

    asyncio.run(scenario())
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "t"]
    assert said == [
        (
            "WARNING",
            "queue server unavailable (ConnectionError); 503s: cannot reach the server at "
            "127.0.0.1:1",
        ),
        ("WARNING", "queue server back after 30 s"),
    ]
    assert len(probed) == 4  # 3 failed, the 4th answered; then the probe stopped


def test_a_new_outage_after_the_end_is_said_again_and_close_stops_the_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="t")
    now = [0.0]
    watch, probed = _watch(probe_fails=1, now=now)

    async def scenario() -> None:
        watch.failed(ConnectionError())
        now[0] = 5.0
        while watch.waiting:
            await asyncio.sleep(0.001)
        now[0] = 60.0  # long past the end: a new outage, not a flap of the last
        watch.probe = asyncio.Event().wait  # a probe that never answers
        watch.failed(TimeoutError())
        await asyncio.sleep(0.01)
        await watch.close()
        assert watch._task is None

    asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if r.name == "t"]
    assert said == [
        "queue server unavailable (ConnectionError); 503s",
        "queue server back after 5 s",
        "queue server unavailable (TimeoutError); 503s",
    ]
    assert len(probed) == 2


def test_a_probe_cancelled_with_its_loop_is_started_again_by_the_next_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a server's loop may end with the probe pending (a test client's portal per
    # request): the next loop's failure probes again, and the outage, not over, is
    # not said twice
    caplog.set_level(logging.INFO, logger="t")
    now = [0.0]
    watch, probed = _watch(probe_fails=10**6, now=now)

    async def fail_once() -> None:
        watch.failed(ConnectionError())
        await asyncio.sleep(0.01)

    asyncio.run(fail_once())
    before = len(probed)
    now[0] = 100.0
    asyncio.run(fail_once())
    assert len(probed) > before
    assert [r.levelname for r in caplog.records if r.name == "t"] == ["WARNING"]


def test_calls_failing_from_many_threads_say_it_once_and_the_next_success_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="t")
    now = [0.0]
    said = OutageLog(Outage("toolq's server", meanwhile="503s"), logging.getLogger("t"),
                     clock=lambda: now[0])  # fmt: skip
    said.answered()  # no outage: nothing
    threads = [
        threading.Thread(target=lambda: [said.failed(ConnectionError()) for _ in range(100)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    now[0] = 42.0
    said.answered()
    said.answered()
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "t"] == [
        ("WARNING", "toolq's server unavailable (ConnectionError); 503s"),
        ("WARNING", "toolq's server back after 42 s"),
    ]
