"""Crash safety with real worker processes killed by SIGKILL (issues 3, 4, 5).

Each test kills a worker while the tool is inside a write: after the side
effect, before the reply. The provider stub counts side effects; the ledger
must settle the operation through verification, never by writing again.
"""

from __future__ import annotations

import os
import signal
import subprocess
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
from tests.integration.conftest import APP, effects, seen
from toolq import State, ToolQueue


@pytest.fixture(scope="module", autouse=True)
def scheduler(rt: ToolQueue, module_redis_url: str) -> Iterator[None]:
    s = start_scheduler(APP, module_redis_url)
    yield
    stop_process(s)


@pytest.fixture
def worker(module_redis_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [start_worker(APP, module_redis_url, pool="prefork", concurrency=1)]
    yield procs
    stop_processes(procs)


def _holder_pid(rt: ToolQueue, ref: str) -> int:
    holder = rt.ledger.fields(ref, "lease_holder").get("lease_holder", "")
    return int(holder.split(":")[1])


def _story(rt: ToolQueue, ref: str) -> str:
    """What a failed assertion shows: the operation's history, transition by transition."""
    rec = rt.get(ref)
    if rec is None:
        return f"{ref}: no record"
    steps = [f"{h.from_}->{h.to} by {h.by} ({h.code})" for h in rec.history]
    return f"{ref}: {rec.state}, attempt {rec.attempt}; " + "; ".join(steps)


def _committed_and_running(rt: ToolQueue, provider: redis.Redis, ref: str) -> bool:
    rec = rt.get(ref)
    return effects(provider, ref) == 1 and rec is not None and rec.state is State.RUNNING


def test_pool_child_killed_mid_write_settles_through_verification(
    rt: ToolQueue, provider: redis.Redis, worker: list[subprocess.Popen[bytes]]
) -> None:
    # Given a write that has committed and is still inside the tool
    ref = rt.submit("pay", {"sleep": 30}, operation_ref="crash/child").operation_ref
    assert wait_until(lambda: _committed_and_running(rt, provider, ref), 20)

    # When the pool child running it is killed (Celery requeues its message)
    os.kill(_holder_pid(rt, ref), signal.SIGKILL)

    # Then the redelivery does not call the tool: the operation is verified
    env = rt.wait(ref, timeout=30)
    # the side effects first: a failure says whether the tool ran twice
    assert (effects(provider, ref), seen(provider, ref)) == (1, [1]), _story(rt, ref)
    assert env.ok and env.verification.evidence_ref == "verification:find_payment", _story(rt, ref)
    rec = rt.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history][-2:] == [State.VERIFYING, State.SUCCEEDED]


def test_whole_worker_killed_mid_write_with_its_message_lost(
    rt: ToolQueue,
    provider: redis.Redis,
    worker: list[subprocess.Popen[bytes]],
    module_redis_url: str,
) -> None:
    # Given a write that has committed and is still inside the tool
    ref = rt.submit("pay", {"sleep": 30}, operation_ref="crash/worker").operation_ref
    assert wait_until(lambda: _committed_and_running(rt, provider, ref), 20)

    # When the whole worker (parent and pool) dies, and its unacked message is
    # gone too, so nothing will ever redeliver it
    kill_group(worker[0])
    rt.redis.delete("unacked", "unacked_index")
    worker.append(start_worker(APP, module_redis_url, pool="prefork", concurrency=1))

    # Then the scheduler's lease sweep finds it and verification settles it
    env = rt.wait(ref, timeout=30)
    # the side effects first: a failure says whether the tool ran twice
    assert (effects(provider, ref), seen(provider, ref)) == (1, [1]), _story(rt, ref)
    assert env.ok, _story(rt, ref)
    rec = rt.get(ref)
    assert rec is not None
    sweep = [h for h in rec.history if h.to == State.VERIFYING]
    assert sweep and sweep[0].by == "scheduler:lease_sweep" and sweep[0].code == "LEASE_EXPIRED"


def test_whole_worker_killed_then_its_message_redelivered(
    rt: ToolQueue,
    provider: redis.Redis,
    worker: list[subprocess.Popen[bytes]],
    module_redis_url: str,
) -> None:
    ref = rt.submit("pay", {"sleep": 30}, operation_ref="crash/redeliver").operation_ref
    assert wait_until(lambda: _committed_and_running(rt, provider, ref), 20)
    kill_group(worker[0])
    # Celery's own redelivery, done at once rather than after the visibility timeout
    queue, message = rt.app.messages.run(ref, 1)
    rt.redis.lpush(queue, message)
    worker.append(start_worker(APP, module_redis_url, pool="prefork", concurrency=1))

    env = rt.wait(ref, timeout=30)
    # the side effects first: a failure says whether the tool ran twice
    assert (effects(provider, ref), seen(provider, ref)) == (1, [1]), _story(rt, ref)
    assert env.ok, _story(rt, ref)
