"""The asyncio pool's patience with the ledger (``run_aio._patient``), on a fake clock.

A try that waited on the event loop (a tool held it) and then timed out is not the
server away: the patience counts from the first failure, so the next try, on a loop
going again, is made. A server away still fails every try and the patience runs out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from toolq.services.tasks import run_aio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(run_aio.time, "monotonic", c.monotonic)
    monkeypatch.setattr(run_aio.asyncio, "sleep", c.sleep)
    yield c


def _tries(clock: Clock, plan: list[tuple[float, bool]], patience_s: float) -> tuple[str, int]:
    """Each try of ``plan`` takes its seconds, then fails (True) or answers; past the
    plan every try fails at once. What ``_patient`` returned or raised, and the tries."""
    tries = 0

    async def fn() -> str:
        nonlocal tries
        took, fails = plan[tries] if tries < len(plan) else (0.0, True)
        tries += 1
        clock.now += took
        if fails:
            raise redis.ConnectionError("No connection available.")
        return "claimed"

    try:
        return asyncio.run(run_aio._patient(fn, patience_s)), tries
    except redis.ConnectionError:
        return "away", tries


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        # the loop held 22 s, the wait timed out: tried again, and it answers
        ([(22.0, True), (0.001, False)], "claimed"),
        # held twice, each shorter than the patience after the first failure
        ([(22.0, True), (5.0, True), (0.001, False)], "claimed"),
        # answers at once
        ([(0.001, False)], "claimed"),
        # a server away: every try fails at once, until the patience ran out
        ([], "away"),
        # held, then away: the patience counts from the first failure
        ([(22.0, True)], "away"),
    ],
)
def test_the_patience_counts_from_the_first_failure(
    clock: Clock, plan: list[tuple[float, bool]], expected: str
) -> None:
    got, tries = _tries(clock, plan, 10.0)
    assert got == expected
    if expected == "away":
        assert tries > 3  # retried with backoff for the whole patience, not given up at once
