"""The asyncio pool when a tool holds the worker's event loop (issue 29's http scenario).

Thousands of calls in flight share one loop and a few ledger connections; a tool that
holds the loop (a blocking call, or a client library's bookkeeping: httpx 0.28's pool
scans every connection on each response) makes the claims waiting for one of those
connections wait as long. That wait is the worker's own, not the server away: before,
it ended after the pool's 20 s as a ConnectionError, the claim's patience ran out and
the delivery was requeued (``the ledger's server did not take the claim``); a claim
now waits its turn. One ``-P asyncio -c 200`` worker, no scheduler (nothing sweeps the
held call's lease while the loop is held).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import start_toolq, stop_process, wait_until
from tests.integration.apps import aio_pool_app
from toolq import ToolQueue

APP = "tests.integration.apps.aio_pool_app:tq"
#: Calls delivered while the loop is held: more than the loop's 32 ledger connections.
CALLS = 120


@pytest.fixture
def aq(redis_url: str) -> Iterator[ToolQueue]:
    tq = aio_pool_app.tq
    tq.configure(redis_url=redis_url)
    yield tq
    tq.close()


@pytest.fixture
def worker_log(aq: ToolQueue, redis_url: str, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        args = ["worker", "--app", APP, "--redis-url", redis_url, "--pool", "asyncio"]
        args += ["--concurrency", "200", "--loglevel", "WARNING"]
        proc = start_toolq(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield log
        finally:
            stop_process(proc)


def test_claims_waiting_for_a_held_loop_are_not_requeued(aq: ToolQueue, worker_log: Path) -> None:
    r: redis.Redis = aq.redis
    hold = aq.submit("hold_loop", {"seconds": 22.0}, operation_ref="stall/hold").operation_ref
    assert wait_until(lambda: r.exists("hold:in"), timeout=60)
    refs = [
        aq.submit("await_slowly", {"seconds": 0.1}, operation_ref=f"stall/{i}").operation_ref
        for i in range(CALLS)
    ]
    # Every call taken by the worker's consumer (none left on the queue), then go.
    assert wait_until(lambda: r.llen("toolq.calls") == 0, timeout=60)
    r.set("hold:go", "1")

    envs = [aq.wait(ref, timeout=180) for ref in [hold, *refs]]
    failed = [env for env in envs if not env.ok]
    assert not failed, failed[:3]
    # Each call was claimed by its first delivery: none went back to the queue.
    text = worker_log.read_text(errors="replace")
    assert text.count("did not take the claim") == 0, text[-3000:]
    for ref in refs:
        rec = aq.get(ref)
        assert rec is not None
        assert [h.to for h in rec.history].count("running") == 1
