"""The asyncio pool's claims and records in batches (toolq.adapters.ledger.aio_batch),
with a real ``-P asyncio`` worker process on a server with ``appendfsync always``.

Every claim of a run waits for the fsync (WAITAOF); in batches one wait covers every
claim of the round trip, so the server counts fewer WAITAOFs than claims, while each
call still runs exactly once. A worker SIGKILLed while its batches are out loses no
call and doubles none: the lease sweep and the claim settle every one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.helpers import (
    kill_group,
    start_scheduler,
    start_worker,
    stop_process,
    stop_processes,
    wait_until,
)
from tests.integration.apps import aio_pool_app
from tests.integration.conftest import effects
from toolq import State, ToolQueue
from toolq.adapters.embedded import EmbeddedServer

APP = "tests.integration.apps.aio_pool_app:tq"
CALLS = 300


@pytest.fixture(scope="module")
def always() -> Iterator[str]:
    with EmbeddedServer(appendfsync="always") as server:
        yield str(server.url)


@pytest.fixture
def aq(always: str) -> Iterator[ToolQueue]:
    tq = aio_pool_app.tq
    tq.configure(redis_url=always)
    tq.redis.flushdb()
    yield tq
    tq.close()


def _waitaofs(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0))


def _states(tq: ToolQueue, refs: list[str]) -> list[str]:
    """Each operation's state, in one pipeline."""
    pipe = tq.redis.pipeline(transaction=False)
    for ref in refs:
        pipe.hget(tq.ledger.keys_of(ref).op(ref), "state")
    return [(s or b"").decode() for s in pipe.execute()]


def _done(tq: ToolQueue, refs: list[str]) -> int:
    return sum(1 for s in _states(tq, refs) if s == State.SUCCEEDED)


def test_queued_calls_run_once_each_with_fewer_fsync_waits_than_claims(
    aq: ToolQueue, always: str
) -> None:
    # Given 300 writes queued before the worker starts (each submit waited for its fsync)
    refs = [aq.submit("awrite", {}, operation_ref=f"batch/{i}").operation_ref for i in range(CALLS)]
    before = _waitaofs(aq.redis)
    # When one asyncio worker holding all of them at once claims, calls and records them
    worker = start_worker(APP, always, pool="asyncio", concurrency=CALLS)
    try:
        finished = wait_until(lambda: _done(aq, refs) == CALLS, 120, interval=0.5)
    finally:
        stop_process(worker)
    claims_waited = _waitaofs(aq.redis) - before
    # Then every call ran once and succeeded on its first attempt
    assert finished, _states(aq, refs)
    assert [effects(aq.redis, ref) for ref in refs] == [1] * CALLS
    attempts = {rec.attempt for ref in refs if (rec := aq.get(ref)) is not None}
    assert attempts == {1}
    # and the claims' fsync waits were shared: fewer WAITAOFs than claims (none is not
    # durable: at least one was sent)
    assert 1 <= claims_waited < CALLS, claims_waited


def test_a_worker_killed_while_its_batches_are_out_loses_and_doubles_no_call(
    aq: ToolQueue, always: str
) -> None:
    # Given writes of varied length (0 to 1.8 s inside the tool) queued for one worker
    refs = [
        aq.submit("awrite", {"sleep": (i % 10) * 0.2}, operation_ref=f"kill/{i}").operation_ref
        for i in range(CALLS)
    ]
    scheduler = start_scheduler(APP, always)
    worker = start_worker(APP, always, pool="asyncio", concurrency=CALLS)
    replacement = None
    try:
        # When it is SIGKILLed while claims, calls and records are under way
        assert wait_until(lambda: _done(aq, refs) >= CALLS // 10, 120, interval=0.05)
        kill_group(worker)
        recorded = _done(aq, refs)
        written = sum(1 for ref in refs if effects(aq.redis, ref))
        # and a new worker takes over
        replacement = start_worker(APP, always, pool="asyncio", concurrency=CALLS)
        finished = wait_until(lambda: _done(aq, refs) == CALLS, 180, interval=0.5)
    finally:
        stop_processes([p for p in (worker, replacement, scheduler) if p is not None])
    # (killed mid-way: some calls recorded, not all)
    assert 0 < recorded < CALLS, recorded
    assert written >= recorded
    # Then every call succeeded, and each write reached the provider exactly once
    assert finished, [s for s in _states(aq, refs) if s != State.SUCCEEDED][:5]
    assert [effects(aq.redis, ref) for ref in refs] == [1] * CALLS
