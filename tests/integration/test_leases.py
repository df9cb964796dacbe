"""Leases and redelivery with real worker processes (issue 12).

One prefork worker (two pool children, so a second delivery can be taken while
the first runs) and one scheduler (whose lease sweep would send an expired
lease to verification) serve the module. The app has a 1 s lease and a 10 s
visibility timeout: see ``tests/integration/apps/lease_app.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import start_scheduler, start_worker, stop_processes, wait_until
from tests.integration.apps import lease_app
from tests.integration.apps.lease_app import APP, attempts, effects, verifications
from toolq import State, ToolQueue


@pytest.fixture(scope="module")
def lq(module_redis_url: str) -> Iterator[ToolQueue]:
    tq = lease_app.tq
    tq.configure(redis_url=module_redis_url)
    procs = [
        start_worker(APP, module_redis_url, pool="prefork", concurrency=2),
        start_scheduler(APP, module_redis_url),
    ]
    try:
        yield tq
    finally:
        stop_processes(procs)
        tq.close()


def _first_lease_until(lq: ToolQueue, ref: str) -> int:
    """When the lease of ``ref``'s first attempt ends (ms); 0 once that attempt is not running."""
    f = lq.ledger.fields(ref, "state", "attempt", "lease_until")
    if f.get("state") != "running" or f.get("attempt") != "1":
        return 0
    return int(float(f.get("lease_until") or 0))


def _counter(lq: ToolQueue, name: str) -> int:
    return lq.ledger.stats().get(f"slow_write|{name}", 0)


def _ran_once_unverified(lq: ToolQueue, ref: str, seconds: float) -> None:
    """One attempt reached the tool and committed; nothing was verified or re-sent."""
    env = lq.wait(ref, timeout=30)
    assert env.ok and env.result == {"held": seconds, "attempt": 1}
    assert env.verification.evidence_ref is None  # its own reply, not a lookup, settled it
    assert attempts(lq.redis, ref) == [1]
    assert effects(lq.redis, ref) == [1]
    assert verifications(lq.redis, ref) == 0
    rec = lq.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history] == [State.QUEUED, State.RUNNING, State.SUCCEEDED]


def test_a_tool_longer_than_its_lease_keeps_it_while_its_worker_lives(lq: ToolQueue) -> None:
    # Given a write that holds its attempt for three and a half leases
    lost_before = _counter(lq, "lease_lost")
    ref = lq.submit("slow_write", {"seconds": 3.5}).operation_ref

    # When it runs, its worker renews the lease (seen moving past a whole lease)
    assert wait_until(lambda: _first_lease_until(lq, ref) > 0, 20)
    claimed_until = _first_lease_until(lq, ref)
    assert wait_until(lambda: _first_lease_until(lq, ref) >= claimed_until + 1000, 10)

    # Then the scheduler's lease sweep never took it: one attempt, one side effect,
    # the verifier never called, no verifying in its history
    _ran_once_unverified(lq, ref, 3.5)
    assert _counter(lq, "lease_lost") == lost_before


def test_a_delivery_again_past_the_visibility_timeout_never_calls_the_tool_twice(
    lq: ToolQueue,
) -> None:
    # Given a write that runs past the broker's visibility timeout (10 s)
    refused_before = _counter(lq, "duplicates_prevented")
    ref = lq.submit("slow_write", {"seconds": 15}).operation_ref

    # When kombu restores its unacknowledged message to the queue and the worker's
    # free pool process takes that copy (kombu restores only messages not acked
    # yet, so the copy was restored while the first delivery still ran)
    assert wait_until(lambda: _counter(lq, "duplicates_prevented") > refused_before, 30), (
        "the message was not delivered again"
    )

    # Then the claim refused the copy: the tool ran once, and nothing was verified
    _ran_once_unverified(lq, ref, 15)
