"""Many messages per fetch (issue 29) with real worker processes: every call runs once,
with far fewer BRPOPs than messages, and a worker SIGKILLed while it holds a fetched
batch loses none of it (kombu's restore of the unacked hash, past the visibility
timeout, gives each message back). The app: ``tests/integration/apps/fetch_app.py``.
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
from tests.integration.apps import fetch_app
from tests.integration.apps.fetch_app import APP, GATE, runs
from toolq import State, ToolQueue
from toolq.adapters.embedded import EmbeddedServer

CALLS = "fetch.calls"


@pytest.fixture
def fq() -> Iterator[ToolQueue]:
    yield fetch_app.tq
    fetch_app.tq.close()


def _brpops(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_brpop", {}).get("calls", 0))


def test_two_hundred_calls_each_run_once_through_far_fewer_brpops(fq: ToolQueue) -> None:
    # A server of its own: its command counts are this test's alone
    with EmbeddedServer(appendonly=False) as server:
        fq.configure(redis_url=server.url)
        r = fq.redis
        # Given 200 calls queued for a worker at its defaults (threads -c 4: a
        # prefetch of four)
        refs = [fq.submit("note", {}).operation_ref for _ in range(200)]
        assert r.llen(CALLS) == 200
        r.config_resetstat()
        worker = start_worker(APP, server.url, pool="threads", concurrency=4)
        try:
            # When it runs them
            for ref in refs:
                env = fq.wait(ref, timeout=60)
                assert env.ok, ref
            brpops = _brpops(r)
        finally:
            stop_process(worker)
        # Then each ran once, and a BRPOP brought several messages on average
        assert [runs(r, ref) for ref in refs] == [[1]] * 200
        assert brpops < len(refs) / 2, brpops
        assert r.llen(CALLS) == 0 and r.hlen("unacked") == 0


def test_a_worker_killed_holding_a_fetched_batch_loses_none_of_it(
    fq: ToolQueue, redis_url: str
) -> None:
    fq.configure(redis_url=redis_url)
    r = fq.redis
    # Given 20 calls that wait for a gate before they run
    refs = [fq.submit("note", {"gated": True}).operation_ref for _ in range(20)]
    # and a worker that prefetches 8 (threads -c 2 and a reserve of 6): one fetch
    # takes them all, two run (held at the gate), six wait in the worker
    worker = start_worker(
        APP, redis_url, pool="threads", concurrency=2, env={"TOOLQ_WORKER__RESERVE": "6"}
    )
    procs = [worker]
    try:

        def held() -> bool:
            states = [rec.state if (rec := fq.get(ref)) else None for ref in refs]
            return r.hlen("unacked") == 8 and states.count(State.RUNNING) == 2

        assert wait_until(held, 30), (r.hlen("unacked"), r.llen(CALLS))
        assert r.llen(CALLS) == 12 and r.zcard("unacked_index") == 8
        # When the whole worker is SIGKILLed, the gate opens, and another worker and a
        # scheduler serve the app (no republish within the test: only kombu's restore
        # of the unacked hash, past the 10 s visibility timeout, brings the 8 back)
        kill_group(worker)
        r.set(GATE, 1)
        procs += [start_worker(APP, redis_url, pool="threads", concurrency=4)]
        procs += [start_scheduler(APP, redis_url)]
        # Then every call succeeds, each having run once: the six that never started at
        # their first attempt, the two the dead worker held at its second
        for ref in refs:
            env = fq.wait(ref, timeout=60)
            assert env.ok, ref
        ran = {ref: runs(r, ref) for ref in refs}
        assert all(len(a) == 1 for a in ran.values()), ran
        assert sorted(a[0] for a in ran.values()) == [1] * 18 + [2] * 2, ran
        assert r.hlen("unacked") == 0 and r.llen(CALLS) == 0
    finally:
        stop_processes(procs)
