"""A submit says when nothing serves its queue; real workers beat; so does `toolq status`.

The case from the issue: a client and its workers on different servers. The
submit goes through (the operation waits, as it should) and says why it will
wait: no live worker for the queue, no live scheduler. Once a real worker and
scheduler run against the server, a fresh client's submit says nothing.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import redis

from tests.helpers import (
    run_aio,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    wait_until,
)
from toolq import ToolQueue
from toolq.keys import Keys
from toolq.loader import load_app
from toolq.monitor import status_snapshot
from toolq.states import State

APP = "tests.integration.apps.runtime_app:tq"
CALLS = "toolq.calls"


@pytest.fixture
def fresh(redis_url: str) -> ToolQueue:
    """The runtime app pointed at this test's server: nothing read about it yet."""
    return load_app(APP, redis_url)


def test_a_submit_to_a_server_nothing_serves_says_so(fresh: ToolQueue) -> None:
    sub = fresh.submit("pay", {"amount_cents": 5})
    # The operation is submitted as ever; the warnings only say why it will wait
    assert sub.created and sub.state is State.QUEUED
    assert len(sub.warnings) == 2, sub.warnings
    assert sub.warnings[0].startswith(f"no live worker for queue {CALLS}")
    assert sub.warnings[1].startswith("no live scheduler")


def test_an_async_submit_says_so_too(fresh: ToolQueue) -> None:
    async def body() -> Any:
        return await fresh.aio.submit("pay", {"amount_cents": 5})

    sub = run_aio(fresh, body)
    assert sub.created and sub.state is State.QUEUED
    assert len(sub.warnings) == 2, sub.warnings
    assert sub.warnings[0].startswith(f"no live worker for queue {CALLS}")
    assert sub.warnings[1].startswith("no live scheduler")


def test_real_workers_beat_and_the_warning_goes(redis_url: str) -> None:
    worker = start_worker(APP, redis_url, queues=CALLS)
    scheduler = start_scheduler(APP, redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        # When a worker and a scheduler run against the server
        beating = wait_until(lambda: client.hexists(Keys().workers, CALLS), 30)
        assert beating, "the worker never beat"
        wait_until(lambda: client.hlen(Keys().schedulers) > 0, 30)
        # Then a new client's submit says nothing, and status shows the queue served
        tq = load_app(APP, redis_url)  # (pointing it there forgets what it read)
        sub = tq.submit("pay", {"amount_cents": 6})
        assert sub.warnings == ()
        snap = status_snapshot(tq, workers=False)
        assert snap["queues"]["workers"][CALLS]["alive"] is True
        assert snap["queues"]["workers"]["toolq.verify"]["alive"] is False  # not consumed
        assert tq.wait(sub.operation_ref, timeout=30).ok
    finally:
        client.close()
        stop_process(worker, timeout=5)
        stop_process(scheduler, timeout=5)


def test_toolq_submit_prints_the_warning_on_stderr(redis_url: str) -> None:
    proc = start_toolq(
        ["submit", "pay", "--args", '{"amount_cents": 7}', "--app", APP, "--redis-url", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    lines = err.decode().splitlines()
    assert out.decode().strip()  # the operation_ref, as ever
    assert [x for x in lines if x.startswith("warning: no live worker for queue")], lines
    # said once: not a second time by the client's log line
    assert sum("no live worker" in x for x in lines) == 1, lines
