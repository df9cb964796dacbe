"""The asyncio pool (``toolq worker -P asyncio``, issue 29) with real worker processes.

One ``-P asyncio -c 200`` worker and a scheduler serve the module: claimed calls,
retries, verification, a duplicate delivery, cancellation, 200 calls in flight at
once on one event loop, a SIGKILL mid-call recovered by the lease sweep, and a plain
``celery -A … worker -P custom`` (``CELERY_CUSTOM_WORKER_POOL``: the pool's path)
whose warm shutdown lets a call finish.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from tests.helpers import (
    REPO_ROOT,
    kill_group,
    start_scheduler,
    start_worker,
    stop_process,
    stop_processes,
    toolq_env,
    wait_until,
)
from tests.integration.apps import aio_pool_app
from tests.integration.conftest import effects, seen
from toolq import State, ToolQueue
from toolq.core.keys import KOMBU_UNACKED
from toolq.core.settings import WorkerSettings
from toolq.process.procs import pdeathsig_preexec
from toolq.services.workers.aio_pool import DOTTED

APP = "tests.integration.apps.aio_pool_app:tq"
IN_FLIGHT = 200


@pytest.fixture(scope="module")
def aq(module_redis_url: str) -> Iterator[ToolQueue]:
    tq = aio_pool_app.tq
    tq.configure(redis_url=module_redis_url)
    scheduler = start_scheduler(APP, module_redis_url)
    yield tq
    stop_process(scheduler)
    tq.close()


@pytest.fixture(scope="module")
def worker(aq: ToolQueue, module_redis_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [start_worker(APP, module_redis_url, pool="asyncio", concurrency=IN_FLIGHT)]
    yield procs
    stop_processes(procs)


@pytest.fixture
def provider(aq: ToolQueue) -> redis.Redis:
    return aq.redis


def _story(tq: ToolQueue, ref: str) -> str:
    rec = tq.get(ref)
    if rec is None:
        return f"{ref}: no record"
    return f"{ref}: {rec.state}; " + "; ".join(
        f"{h.from_}->{h.to} by {h.by} ({h.code})" for h in rec.history
    )


def test_an_async_write_is_claimed_called_and_recorded(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]], provider: redis.Redis
) -> None:
    ref = aq.submit("awrite", {}, operation_ref="aio/ok").operation_ref
    env = aq.wait(ref, timeout=30)

    assert env.ok and env.result == {"paid": ref, "attempt": 1}, _story(aq, ref)
    assert effects(provider, ref) == 1 and seen(provider, ref) == [1]
    rec = aq.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history] == [State.QUEUED, State.RUNNING, State.SUCCEEDED]
    assert rec.history[1].by.split(":")[1] == str(worker[0].pid)  # the loop's own process


def test_a_rate_limited_write_is_retried_until_it_succeeds(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]], provider: redis.Redis
) -> None:
    ref = aq.submit("awrite", {"mode": "rate_limited"}, operation_ref="aio/retry").operation_ref
    env = aq.wait(ref, timeout=30)

    assert env.ok and env.result == {"paid": ref, "attempt": 3}, _story(aq, ref)
    assert seen(provider, ref) == [1, 2, 3] and effects(provider, ref) == 1
    rec = aq.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history].count(State.WAITING_RETRY) == 2


def test_an_unknown_outcome_is_settled_by_the_async_verifier(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]], provider: redis.Redis
) -> None:
    ref = aq.submit("awrite", {"mode": "lost_reply"}, operation_ref="aio/lost").operation_ref
    env = aq.wait(ref, timeout=30)

    assert env.ok and env.verification.evidence_ref == "verification:afind", _story(aq, ref)
    assert effects(provider, ref) == 1 and seen(provider, ref) == [1]
    assert int(provider.get(f"provider:lookups:{ref}") or 0) >= 1
    rec = aq.get(ref)
    assert rec is not None
    assert [(h.to, h.code) for h in rec.history][-1] == (State.SUCCEEDED, "VERIFIED_COMMITTED")


def test_a_second_delivery_of_a_running_call_is_dropped(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]], provider: redis.Redis
) -> None:
    ref = aq.submit("awrite", {"sleep": 2}, operation_ref="aio/dup").operation_ref
    assert wait_until(lambda: effects(provider, ref) == 1, 20)
    # The same message again while the first delivery is inside the tool
    queue, message = aq.app.messages.run(ref, 1)
    provider.lpush(queue, message)
    assert wait_until(lambda: provider.llen(queue) == 0, 20)

    env = aq.wait(ref, timeout=30)
    assert env.ok and env.result == {"paid": ref, "attempt": 1}, _story(aq, ref)
    assert seen(provider, ref) == [1] and effects(provider, ref) == 1
    rec = aq.get(ref)
    assert rec is not None and [h.to for h in rec.history].count(State.RUNNING) == 1


def test_a_cancelled_call_delivered_late_is_refused_and_acknowledged(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]], provider: redis.Redis
) -> None:
    # Given an operation cancelled before it ran (it awaited approval: no message yet)
    ref = aq.submit("aapproved", {}, operation_ref="aio/cancel").operation_ref
    assert aq.cancel(ref) is State.CANCELLED
    # When a delivery of its first attempt reaches the asyncio worker anyway
    queue, message = aq.app.messages.run(ref, 1)
    provider.lpush(queue, message)
    # Then the claim refuses it: the tool is not called and the message is acknowledged
    assert wait_until(lambda: provider.llen(queue) == 0, 20)
    assert wait_until(lambda: provider.hlen(KOMBU_UNACKED) == 0, 20)
    assert effects(provider, ref) == 0
    rec = aq.get(ref)
    assert rec is not None and rec.state is State.CANCELLED
    assert State.RUNNING not in [h.to for h in rec.history]


def test_the_worker_runs_its_calls_with_the_collectors_first_threshold_raised(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]]
) -> None:
    """``worker.gc_threshold`` (default 10,000) reaches the pool in a real worker process."""
    env = aq.wait(aq.submit("gc_threshold", {}).operation_ref, timeout=30)

    assert env.ok and env.result == {"first": WorkerSettings().gc_threshold}


def test_a_sync_tool_runs_on_the_pools_threads(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]]
) -> None:
    ref = aq.submit("sync_read", {"seconds": 0.05}, operation_ref="aio/sync").operation_ref
    env = aq.wait(ref, timeout=30)
    assert env.ok, _story(aq, ref)
    assert env.result["thread"].startswith("toolq-aio-sync")


def test_every_call_up_to_the_concurrency_is_in_flight_at_once(
    aq: ToolQueue, worker: list[subprocess.Popen[bytes]], provider: redis.Redis
) -> None:
    provider.delete("provider:inflight", "provider:inflight:max")
    refs = [
        aq.submit(
            "await_slowly", {"seconds": 60, "until": IN_FLIGHT}, operation_ref=f"aio/many/{i}"
        ).operation_ref
        for i in range(IN_FLIGHT)
    ]
    envs = [aq.wait(ref, timeout=120) for ref in refs]

    failed = [ref for ref, env in zip(refs, envs, strict=True) if not env.ok]
    assert not failed, [_story(aq, ref) for ref in failed[:3]]
    # One process, one loop thread, and all 200 calls inside the tool at one moment (each
    # stays in until it saw 200, or 60 s passed: a pool holding fewer sees its most)
    assert {(env.result["pid"], env.result["thread"]) for env in envs} == {
        (worker[0].pid, envs[0].result["thread"])
    }
    assert int(provider.get("provider:inflight:max") or 0) == IN_FLIGHT
    assert int(provider.get("provider:inflight") or 0) == 0


def test_a_worker_killed_mid_write_is_recovered_once_by_the_lease_sweep(
    aq: ToolQueue,
    worker: list[subprocess.Popen[bytes]],
    provider: redis.Redis,
    module_redis_url: str,
) -> None:
    # Given a write that committed and is still inside the tool
    ref = aq.submit("awrite", {"sleep": 30}, operation_ref="aio/crash").operation_ref
    assert wait_until(lambda: effects(provider, ref) == 1, 20)
    # When the worker is SIGKILLed and its unacked messages are gone too
    kill_group(worker[0])
    provider.delete("unacked", "unacked_index")
    worker.append(start_worker(APP, module_redis_url, pool="asyncio", concurrency=IN_FLIGHT))

    # Then the lease sweep sends the write to verification, which finds it, once
    env = aq.wait(ref, timeout=60)
    assert (effects(provider, ref), seen(provider, ref)) == (1, [1]), _story(aq, ref)
    assert env.ok, _story(aq, ref)
    rec = aq.get(ref)
    assert rec is not None
    sweeps = [h for h in rec.history if h.by == "scheduler:lease_sweep"]
    assert [(h.to, h.code) for h in sweeps] == [(State.VERIFYING, "LEASE_EXPIRED")]


def test_a_plain_celery_worker_runs_the_pool_by_its_path_and_drains_on_sigterm(
    aq: ToolQueue,
    worker: list[subprocess.Popen[bytes]],
    provider: redis.Redis,
    module_redis_url: str,
) -> None:
    for w in worker:  # only the plain worker serves this test
        stop_process(w)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.apps.aio_pool_app:celery_app",
            "worker",
            "--pool",
            "custom",  # Celery's name for the pool CELERY_CUSTOM_WORKER_POOL names
            "-c",
            "8",
            "-Q",
            "toolq.calls,toolq.verify",
            "--hostname",
            "plain-aio@%h",
            "--loglevel",
            "WARNING",
        ],
        env=toolq_env({"TOOLQ_REDIS_URL": module_redis_url, "CELERY_CUSTOM_WORKER_POOL": DOTTED}),
        cwd=str(REPO_ROOT),
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
    )
    try:
        lost = aq.submit("awrite", {"mode": "lost_reply"}, operation_ref="aio/plain").operation_ref
        assert aq.wait(lost, timeout=30).ok, _story(aq, lost)
        # A call in flight when the worker is asked to stop (warm shutdown) finishes
        ref = aq.submit("awrite", {"sleep": 2}, operation_ref="aio/warm").operation_ref
        assert wait_until(lambda: effects(provider, ref) == 1, 20)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        rec = aq.get(ref)
        assert rec is not None and rec.state is State.SUCCEEDED, _story(aq, ref)
        assert provider.hlen(KOMBU_UNACKED) == 0
    finally:
        stop_process(p)
