"""``def`` tools on the asyncio pool (``-P asyncio -c 16``, issue 29) with real workers:
every slot's call blocks a thread of its own at once, and Celery's tracer runs user
code (a task-signal receiver) on those threads, never on the loop.

Without receivers the tracer runs on the loop's thread
(:func:`toolq.services.workers.aio_pool.traced_inline`, tests/unit/test_aio_pool_options.py);
here the deliveries it acknowledges leave nothing unacknowledged behind.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.helpers import start_worker, stop_process, wait_until
from tests.integration.apps import aio_pool_app
from toolq import ToolQueue
from toolq.core.keys import KOMBU_UNACKED

APP = "tests.integration.apps.aio_pool_app:tq"
SLOTS = 16


@pytest.fixture(scope="module")
def aq(module_redis_url: str) -> Iterator[ToolQueue]:
    tq = aio_pool_app.tq
    tq.configure(redis_url=module_redis_url)
    yield tq
    tq.close()


def _worker(url: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return start_worker(APP, url, pool="asyncio", concurrency=SLOTS, env=env)


def _counted_calls(tq: ToolQueue, tag: str, n: int) -> list[str]:
    args = {"seconds": 60, "until": n}
    return [
        tq.submit("sync_counted", args, operation_ref=f"aio-threads/{tag}/{i}").operation_ref
        for i in range(n)
    ]


def test_every_slot_holds_a_blocking_sync_call_at_once(
    aq: ToolQueue, module_redis_url: str
) -> None:
    r = aq.redis
    r.delete("provider:sync:inflight", "provider:sync:inflight:max", "provider:signal:threads")
    worker = _worker(module_redis_url)
    try:
        # Given as many calls of a blocking `def` tool as the worker has slots (each stays
        # inside the tool until it saw them all in, or 60 s passed)
        refs = _counted_calls(aq, "all", SLOTS)
        envs = [aq.wait(ref, timeout=120) for ref in refs]
    finally:
        stop_process(worker)

    # Then all were inside the tool at one moment, each on a pool thread of its own
    assert all(env.ok for env in envs), [env for env in envs if not env.ok][:2]
    assert int(r.get("provider:sync:inflight:max") or 0) == SLOTS
    threads = {env.result["thread"] for env in envs}
    assert len(threads) == SLOTS and all(t.startswith("toolq-aio-sync") for t in threads)
    # and every delivery was acknowledged, no task-signal receiver ran (none connected)
    assert wait_until(lambda: r.hlen(KOMBU_UNACKED) == 0, 20)
    assert r.llen("provider:signal:threads") == 0


def test_a_task_signal_receiver_runs_on_a_pool_thread_not_the_loop(
    aq: ToolQueue, module_redis_url: str
) -> None:
    r = aq.redis
    r.delete("provider:sync:inflight", "provider:sync:inflight:max", "provider:signal:threads")
    worker = _worker(module_redis_url, env={"AIO_POOL_APP_TASK_SIGNAL": "1"})
    try:
        # Given a worker whose app connects a task_success receiver (user code, may block)
        refs = _counted_calls(aq, "signal", SLOTS)
        refs.append(aq.submit("await_slowly", {"seconds": 0.1}).operation_ref)
        envs = [aq.wait(ref, timeout=120) for ref in refs]
        assert all(env.ok for env in envs), [env for env in envs if not env.ok][:2]
        assert wait_until(lambda: r.llen("provider:signal:threads") == len(refs), 20)
    finally:
        stop_process(worker)

    # Then Celery's tracer ran each on the pool's threads, async tool's calls too
    names = [n.decode() for n in r.lrange("provider:signal:threads", 0, -1)]
    assert all(n.startswith("toolq-aio-sync") for n in names), names
    assert int(r.get("provider:sync:inflight:max") or 0) == SLOTS
    assert wait_until(lambda: r.hlen(KOMBU_UNACKED) == 0, 20)
