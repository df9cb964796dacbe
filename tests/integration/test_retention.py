"""Finished operations are kept for ``recovery.retention``, then forgotten (issue 12).

A real worker finishes the operations; the scheduler's maintenance is driven
in this process with an injected clock, so retention is crossed without waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from tests.helpers import start_worker, stop_process
from tests.integration.apps import lease_app
from tests.integration.apps.lease_app import APP, RETENTION_S
from toolq import ToolQueue
from toolq.services.scheduler.service import Scheduler


@pytest.fixture(scope="module")
def lq(module_redis_url: str) -> Iterator[ToolQueue]:
    tq = lease_app.tq
    tq.configure(redis_url=module_redis_url)
    worker = start_worker(APP, module_redis_url, concurrency=2)
    try:
        yield tq
    finally:
        stop_process(worker)
        tq.close()


def _finished(lq: ToolQueue) -> str:
    ref = lq.submit("slow_write", {"seconds": 0}).operation_ref
    assert lq.wait(ref, timeout=20).ok
    return ref


def _maintain_at(lq: ToolQueue, at_s: float) -> None:
    """Run one scheduler maintenance pass as if the time were ``at_s``."""
    sched = Scheduler(lq.app, clock=lambda: at_s)
    # Maintenance runs at most once a minute of monotonic time; this pass must run now.
    sched._last_maintenance = -math.inf
    sched._maintain()


def test_a_finished_record_and_its_history_expire_after_retention(lq: ToolQueue) -> None:
    done = _finished(lq)
    waiting = lq.submit("approved_write", {"seconds": 0}).operation_ref
    keys = lq.ledger.keys

    # (the history is part of the record: toolq.adapters.ledger.scripts)
    assert 0 < lq.redis.ttl(keys.op(done)) <= RETENTION_S
    assert lq.ledger.history(done)
    # An operation still waiting on someone never expires under them
    assert lq.redis.ttl(keys.op(waiting)) == -1


def test_maintenance_forgets_index_entries_only_of_operations_finished_past_retention(
    lq: ToolQueue,
) -> None:
    # Given a finished operation, and one submitted as long ago that waits for approval
    waiting = lq.submit("approved_write", {"seconds": 1}).operation_ref
    done = _finished(lq)
    keys = lq.ledger.keys
    succeeded = keys.index("slow_write", "succeeded")
    awaiting = keys.index("approved_write", "awaiting_approval")
    finished_at = lq.redis.zscore(succeeded, done)
    assert finished_at is not None

    # When maintenance runs a second before the finished one is past retention
    _maintain_at(lq, finished_at / 1000 + RETENTION_S - 1)
    # Then it stays listed
    assert lq.redis.zscore(succeeded, done) == finished_at

    # When maintenance runs a second after
    _maintain_at(lq, finished_at / 1000 + RETENTION_S + 1)
    # Then the finished one is forgotten; the waiting one, older still, is kept
    assert lq.redis.zscore(succeeded, done) is None
    assert lq.redis.zscore(awaiting, waiting) is not None
