"""``async def`` tools and verifiers, end to end with real worker processes (issue 12).

Each test runs once per Celery pool: ``threads`` (tools awaited on each pool
thread's loop), ``prefork`` (on each child process's loop) and ``asyncio`` (on the
pool's one loop, issue 29).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest
import redis

from tests.helpers import start_scheduler, start_worker, stop_process
from tests.integration.apps import async_app
from tests.integration.conftest import effects, seen
from toolq import State, ToolQueue

APP = "tests.integration.apps.async_app:tq"


@pytest.fixture(scope="module")
def atq(module_redis_url: str) -> Iterator[ToolQueue]:
    tq = async_app.tq
    tq.configure(redis_url=module_redis_url)
    scheduler = start_scheduler(APP, module_redis_url)
    yield tq
    stop_process(scheduler)
    tq.close()


@pytest.fixture(scope="module", params=["threads", "prefork", "asyncio"])
def pool(request: pytest.FixtureRequest, atq: ToolQueue, module_redis_url: str) -> Iterator[str]:
    worker = start_worker(APP, module_redis_url, pool=request.param, concurrency=2)
    yield str(request.param)
    stop_process(worker)


@pytest.fixture
def provider(atq: ToolQueue) -> redis.Redis:
    return atq.redis


def test_an_async_write_runs_once_and_succeeds(
    atq: ToolQueue, pool: str, provider: redis.Redis
) -> None:
    ref = atq.submit("apay", {}, operation_ref=f"{pool}/ok").operation_ref
    env = atq.wait(ref, timeout=30)

    assert env.ok, env
    assert env.result == {"paid": ref, "attempt": 1}
    assert effects(provider, ref) == 1 and seen(provider, ref) == [1]
    rec = atq.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history][-2:] == [State.RUNNING, State.SUCCEEDED]
    assert provider.get(f"provider:lookups:{ref}") is None  # nothing was uncertain


def test_an_unknown_outcome_is_settled_by_the_async_verifier(
    atq: ToolQueue, pool: str, provider: redis.Redis
) -> None:
    # Given an async write that commits and then loses its reply
    ref = atq.submit("apay", {"mode": "lost_reply"}, operation_ref=f"{pool}/lost").operation_ref
    # When the worker records the unknown outcome and verification runs
    env = atq.wait(ref, timeout=30)
    # Then the async verifier found the write: one side effect, no second attempt
    assert env.ok, env
    assert env.verification.evidence_ref == "verification:afind_payment"
    assert effects(provider, ref) == 1 and seen(provider, ref) == [1]
    assert int(provider.get(f"provider:lookups:{ref}") or 0) >= 1
    rec = atq.get(ref)
    assert rec is not None
    codes = [(h.to, h.code) for h in rec.history]
    assert (State.VERIFYING, "OUTCOME_UNKNOWN") in codes
    assert codes[-1] == (State.SUCCEEDED, "VERIFIED_COMMITTED")


def test_each_worker_thread_awaits_on_one_loop_reused_across_calls(
    atq: ToolQueue, pool: str, provider: redis.Redis
) -> None:
    refs = [
        atq.submit("apay", {}, operation_ref=f"{pool}/many/{i}").operation_ref for i in range(6)
    ]
    for ref in refs:
        env = atq.wait(ref, timeout=30)
        assert env.ok, env

    loops_of: dict[str, set[str]] = defaultdict(set)
    calls = 0
    for row in provider.lrange("provider:loops", 0, -1):
        ref, thread, loop = row.decode().split("|")
        if ref in refs:
            loops_of[thread].add(loop)
            calls += 1
    assert calls == len(refs)
    # Concurrency 2: at most two threads (or children) served six calls, so
    # some thread served several, and every thread did so on a single loop.
    assert 1 <= len(loops_of) <= 2
    assert all(len(loops) == 1 for loops in loops_of.values()), dict(loops_of)
