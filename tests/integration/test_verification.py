"""The verification queue settles every unknown outcome (issue 5).

Calls and verification are served by separate worker pools here, as a
deployment that sizes verification apart from writes would run them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.helpers import start_scheduler, start_worker, stop_process, wait_until
from tests.integration.conftest import APP, effects, seen
from toolq import State, ToolQueue


@pytest.fixture(scope="module", autouse=True)
def processes(rt: ToolQueue, module_redis_url: str) -> Iterator[None]:
    procs = [
        start_worker(APP, module_redis_url, queues="toolq.calls", concurrency=2),
        start_worker(APP, module_redis_url, queues="toolq.verify", concurrency=2),
        start_scheduler(APP, module_redis_url),
    ]
    yield
    for p in procs:
        stop_process(p)


def test_commit_then_lost_reply_is_verified_as_succeeded(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    ref = rt.submit("pay", {"mode": "lost_reply"}, operation_ref="v/lost_reply").operation_ref
    env = rt.wait(ref, timeout=20)

    assert env.ok and env.verification.evidence_ref == "verification:find_payment"
    assert effects(provider, ref) == 1 and seen(provider, ref) == [1]
    rec = rt.get(ref)
    assert rec is not None
    codes = [(h.to, h.code) for h in rec.history]
    assert (State.VERIFYING, "OUTCOME_UNKNOWN") in codes
    assert codes[-1] == (State.SUCCEEDED, "VERIFIED_COMMITTED")
    assert rt.ledger.stats()["pay|verify_found"] >= 1


def test_timeout_before_commit_is_redispatched_once_with_the_same_ref(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    ref = rt.submit("pay", {"mode": "timeout_before_commit"}).operation_ref
    env = rt.wait(ref, timeout=20)

    assert env.ok and env.result == {"paid": ref, "attempt": 2}
    assert effects(provider, ref) == 1
    assert seen(provider, ref) == [1, 2]
    rec = rt.get(ref)
    assert rec is not None
    uncertain = next(h.at for h in rec.history if h.to == State.VERIFYING)
    requeued = next(h for h in rec.history if h.code == "VERIFIED_NOT_COMMITTED")
    assert requeued.to == State.QUEUED and requeued.attempt == 2
    assert requeued.at - uncertain >= 500  # not before the consistency window passed


def test_verifier_down_rechecks_then_escalates_and_stays_there(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    provider.set("provider:verifier_down", "1")
    try:
        ref = rt.submit("pay", {"mode": "verifier_down"}).operation_ref
        # While it is verifying, the agent sees the unknown outcome, never a retry
        assert wait_until(lambda: rt.get(ref).state is State.VERIFYING, 10)  # type: ignore[union-attr]
        pending = rt.wait(ref, timeout=0.05)
        assert not pending.ok and pending.code == "OUTCOME_UNKNOWN"
        assert pending.commit_state == "unknown" and pending.next_action == "verify_operation"
        assert pending.safe_details["verification_tool"] == "find_payment"

        env = rt.wait(ref, timeout=20)
        assert not env.ok and env.code == "VERIFICATION_UNAVAILABLE"
        assert env.commit_state == "unknown"
        checks = int(provider.get("provider:verifications") or 0)
        assert checks >= 3
    finally:
        provider.delete("provider:verifier_down")
    # When the verifier comes back, nothing runs without an operator: the scheduler
    # holds nothing due for it, and work queued after it on both queues goes past it
    rev = rt.ledger.fields(ref, "rev")["rev"]
    assert rt.redis.zscore(rt.ledger.keys.due, ref) is None
    later = rt.submit("pay", {"mode": "lost_reply"}).operation_ref  # a call, then a check
    assert rt.wait(later, timeout=20).ok
    assert rt.ledger.fields(ref, "state", "rev") == {"state": "escalated", "rev": rev}
    assert seen(provider, ref) == [1] and effects(provider, ref) == 1
