"""The ledger acknowledges each Celery delivery in the call that ends it (issue 14).

With the ledger's server as the broker, a refused claim or the record of an
outcome removes the delivery from kombu's unacked hash and index in the same
script, and the worker's own ack sends nothing: one round trip (a MULTI/EXEC
pipeline) less per call. Real workers, each pool (threads, prefork, asyncio), against
the session's Valkey.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import redis

from tests.helpers import start_worker, stop_process, wait_until
from tests.integration.conftest import APP
from toolq import ToolQueue
from toolq.core.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX

CALLS = 40


def _execs(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_exec", {}).get("calls", 0))


def _nothing_unacked(r: redis.Redis) -> bool:
    return r.hlen(KOMBU_UNACKED) == 0 and r.zcard(KOMBU_UNACKED_INDEX) == 0


@pytest.fixture(params=["threads", "prefork", "asyncio"])
def worker(request: pytest.FixtureRequest, module_redis_url: str) -> Iterator[str]:
    w: subprocess.Popen[bytes] = start_worker(
        APP, module_redis_url, pool=request.param, concurrency=2
    )
    yield request.param
    stop_process(w)


def test_each_delivery_is_acknowledged_by_the_ledger_call_that_ends_it(
    rt: ToolQueue, worker: str
) -> None:
    r = rt.redis
    warm = rt.submit("lookup", {"mode": "ok"}).operation_ref  # the worker is up
    assert rt.wait(warm, timeout=30).ok
    before = _execs(r)

    refs = [rt.submit("lookup", {"mode": "ok"}).operation_ref for _ in range(CALLS)]
    assert all(rt.wait(ref, timeout=30).ok for ref in refs)
    execs = _execs(r) - before

    # kombu still records each delivery in the unacked hash (one MULTI/EXEC); its ack,
    # another MULTI/EXEC per call before, is now inside the ledger's APPLY.
    assert execs < CALLS * 1.5, f"{execs} EXECs for {CALLS} calls on {worker}"
    assert wait_until(lambda: _nothing_unacked(r), 10)


def test_a_refused_copy_is_acknowledged_too(rt: ToolQueue, worker: str) -> None:
    r = rt.redis
    ref = rt.submit("pay", {"sleep": 0.5}).operation_ref
    queue, message = rt.app.messages.run(ref, 1)
    r.lpush(queue, message)  # a second delivery while the first one runs: "held"
    assert rt.wait(ref, timeout=30).ok
    r.lpush(queue, message)  # and one after it settled: "stale"

    assert wait_until(lambda: r.llen(queue) == 0 and _nothing_unacked(r), 15)
    assert wait_until(lambda: rt.ledger.stats().get("pay|duplicates_prevented", 0) >= 2, 10)
