"""A submit says when nothing serves its queue; real workers beat; so does `toolq status`.

The case from the issue: a client and its workers on different servers. The
submit goes through (the operation waits, as it should) and says why it will
wait: no live worker for the queue, no live scheduler. Once a real worker and
scheduler run against the server, a fresh client's submit says nothing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest
import redis

from tests.helpers import (
    run_aio,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    stop_processes,
    toolq_env,
    wait_until,
)
from toolq import ToolQueue
from toolq.adapters.liveness import WorkerNode
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.core.states import State
from toolq.edges import monitor
from toolq.edges.loader import load_app
from toolq.edges.monitor import status_snapshot

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
        stop_processes((worker, scheduler), timeout=5)


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


def test_each_worker_beats_its_own_entry_and_status_counts_it(redis_url: str) -> None:
    """`toolq status` (the real CLI, no --app: no Celery imported) counts live workers
    from their beats, with what each runs; a worker that stops takes its entry out."""
    # Given two workers of different shapes
    calls = start_worker(APP, redis_url, queues=CALLS, pool="threads", concurrency=3)
    verify = start_worker(APP, redis_url, queues="toolq.verify", pool="solo", concurrency=1)
    client = redis.Redis.from_url(redis_url)
    try:
        assert wait_until(lambda: client.hlen(Keys().worker_nodes) == 2, 30), "no beats"
        # When an operator asks for the status
        snap = _status_json(redis_url)
        # Then both are live, each with its pool, concurrency and queues
        workers = snap["workers"]
        assert (workers["checked"], workers["source"], workers["live"]) == (True, "heartbeats", 2)
        shapes = sorted((w["pool"], w["concurrency"], w["queues"]) for w in workers["nodes"])
        assert shapes == [("solo", 1, ["toolq.verify"]), ("threads", 3, [CALLS])]
        assert all(w["alive"] and w["pid"] > 0 for w in workers["nodes"])
        # And a worker that stops is gone from the next status at once
        stop_process(verify, timeout=10)
        assert wait_until(lambda: client.hlen(Keys().worker_nodes) == 1, 10)
        assert _status_json(redis_url)["workers"]["live"] == 1
    finally:
        client.close()
        stop_processes((calls, verify), timeout=5)


def test_a_killed_worker_leaves_the_live_list_once_its_beat_is_stale(redis_url: str) -> None:
    """The issue's case: `calls-1@host` SIGKILLed and started again; its dead entry
    stayed beside the live one. Beats every 0.2 s, stale after 1 s (the settings)."""
    env = {"TOOLQ_WORKER__BEAT_S": "0.2", "TOOLQ_WORKER__ALIVE_S": "1"}
    name = ["--hostname", "calls-1@host"]
    client = redis.Redis.from_url(redis_url)
    first = start_worker(APP, redis_url, queues=CALLS, pool="solo", env=env, extra_args=name)
    second = None
    try:
        assert wait_until(lambda: client.hlen(Keys().worker_nodes) == 1, 30), "no beat"
        (dead,) = [WorkerNode.from_json(v) for v in client.hvals(Keys().worker_nodes)]
        assert dead is not None and dead.node == "calls-1@host"
        # When it is SIGKILLed (no goodbye: its entry stays) and started again
        stop_process(first, signal.SIGKILL, timeout=5)
        second = start_worker(APP, redis_url, queues=CALLS, pool="solo", env=env, extra_args=name)
        assert wait_until(lambda: client.hlen(Keys().worker_nodes) == 2, 30), "no new beat"
        assert client.hexists(Keys().worker_nodes, dead.field)  # the dead entry is still there

        # Then, once its beat is older than alive_s, status lists the live one alone
        # (the status that showed it is the one read below: asked again, a live beat a
        # second late on a loaded machine reads as no live worker at all)
        shown: list[dict[str, Any]] = []

        def only_the_live_one() -> bool:
            w: dict[str, Any] = _status_json(redis_url, env)["workers"]
            pids = [n["pid"] for n in w["nodes"]]
            shown.append(w)
            return w["live"] == 1 and dead.pid not in pids

        assert wait_until(only_the_live_one, 30, interval=0.2), shown[-1:]
        workers = shown[-1]
        assert workers["names"] == ["calls-1@host"]
        assert workers["gone"] == []  # replaced by its restart: not listed as gone either
        assert client.hexists(Keys().worker_nodes, dead.field)  # read past, not deleted
    finally:
        client.close()
        stop_process(first, timeout=5)
        if second is not None:
            stop_process(second, timeout=5)


def _status_json(redis_url: str, env: dict[str, str] | None = None) -> Any:
    proc = start_toolq(
        ["status", "--json", "--redis-url", redis_url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def test_status_without_an_app_imports_no_celery(redis_url: str) -> None:
    """What keeps `toolq status` under 0.3 s: it reads Redis, and imports nothing else."""
    code = (
        "import sys; from toolq.edges.cli import main\n"
        f"main(['status', '--redis-url', {str(redis_url)!r}], standalone_mode=False)\n"
        "heavy = ('celery', 'kombu', 'fastapi', 'toolq.client.queue')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print('heavy:', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=toolq_env(), capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert "heavy: []" in proc.stdout.decode(), proc.stdout.decode()


def test_the_overview_and_its_chart_come_from_redis_alone(redis_url: str) -> None:
    """What the console draws, on `tq.aio`: workers and schedulers from their beats,
    the chart from the samples the real scheduler writes."""
    worker = start_worker(APP, redis_url)
    scheduler = start_scheduler(APP, redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        tq = load_app(APP, redis_url)
        # Given a deployment at work, whose scheduler has taken a sample
        assert tq.call("pay", {"amount_cents": 8}, timeout=30).ok
        assert wait_until(lambda: client.hlen(Keys().series) > 0, 30), "no sample"
        assert wait_until(lambda: client.hlen(Keys().worker_nodes) == 1, 30)

        async def body() -> tuple[Any, Any]:
            return await monitor.overview(tq.aio), await monitor.series(tq.aio, 1)

        ov, points = run_aio(tq, body)
        # Then the overview counts them, with no broadcast
        assert ov["workers"]["live"] == 1 and ov["scheduler"]["live"] == 1
        assert ov["tools"]["pay"]["states"]["succeeded"] == 1
        assert set(ov["pending"]) == {
            "waiting_retry",
            "verifying",
            "needs_input",
            "awaiting_approval",
            "escalated",
        }
        # And the chart has the scheduler's sample (the first has no counts yet)
        assert points and points[-1].pending == dict.fromkeys(points[-1].pending, 0)
        with pytest.raises(errors.InvalidArguments):
            run_aio(tq, lambda: monitor.series(tq.aio, 0))
    finally:
        client.close()
        stop_processes((worker, scheduler), timeout=5)
