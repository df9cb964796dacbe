"""Write tasks through Celery with real worker processes (issue 3).

One prefork worker (two pool children) and one scheduler serve the module.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
import redis

from tests.helpers import start_scheduler, start_worker, stop_processes, wait_until
from tests.integration.conftest import APP, effects, seen
from toolq import State, ToolQueue
from toolq.core import errors


@pytest.fixture(scope="module", autouse=True)
def processes(rt: ToolQueue, module_redis_url: str) -> Iterator[None]:
    w = start_worker(APP, module_redis_url, pool="prefork", concurrency=2)
    s = start_scheduler(APP, module_redis_url)
    try:
        yield
    finally:
        stop_processes((w, s))


def test_a_call_that_succeeds_records_a_committed_envelope(rt: ToolQueue) -> None:
    sub = rt.submit("pay", {"amount_cents": "250"}, operation_ref="run_1/step_1", call_id="call_1")
    env = rt.wait(sub.operation_ref, timeout=20)

    assert env.ok and env.commit_state.value == "committed"
    assert env.result == {"paid": "run_1/step_1", "attempt": 1}
    assert env.call_id == "call_1" and env.operation == "pay"
    rec = rt.get("run_1/step_1")
    assert rec is not None and rec.state is State.SUCCEEDED
    assert [(h.from_, h.to) for h in rec.history] == [
        (None, State.QUEUED),
        (State.QUEUED, State.RUNNING),
        (State.RUNNING, State.SUCCEEDED),
    ]


def test_every_attempt_sends_the_same_operation_ref(rt: ToolQueue, provider: redis.Redis) -> None:
    # Given a provider that rate-limits the first two attempts
    ref = rt.submit("pay", {"mode": "rate_limited"}).operation_ref
    remaining: list[int] = []
    not_before: list[datetime] = []

    def watch() -> None:
        while True:
            rec = rt.get(ref)
            if rec is None or rec.terminal:
                return
            env = rec.envelope
            if env is not None and not env.ok and env.code == "RATE_LIMITED":
                n = env.retry.max_attempts_remaining
                if not remaining or remaining[-1] != n:
                    remaining.append(n)
                    assert env.retry.not_before is not None
                    not_before.append(env.retry.not_before)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    # When it is retried by the scheduler until it succeeds
    env = rt.wait(ref, timeout=30)
    watcher.join(timeout=10)

    # Then every attempt carried the same ref, the budget went down by one each
    # time, and no attempt ran before its not_before
    assert env.ok and env.result["attempt"] == 3
    assert seen(provider, ref) == [1, 2, 3]
    assert remaining == [4, 3]
    rec = rt.get(ref)
    assert rec is not None
    started_at = [h.at for h in rec.history if h.to == State.RUNNING]
    # Compared with the envelope's not_before, not the waiting_retry entry's stamp: a
    # step is stamped when it is recorded, a few ms after it was decided (the time
    # not_before counts from), so "failure stamp + 0.4 s" can be later than it.
    nb_ms = [round(nb.timestamp() * 1000) for nb in not_before]
    for start, nb, nxt in zip(started_at[:-1], nb_ms, started_at[1:], strict=True):
        assert nb - start >= 400  # retry_after=0.4 s, counted from after the attempt began
        assert nxt >= nb
    assert effects(provider, ref) == 1


def test_a_message_delivered_twice_runs_the_tool_once(rt: ToolQueue, provider: redis.Redis) -> None:
    # Given a slow write, and a second copy of its message in the queue
    ref = rt.submit("pay", {"sleep": 1.0}, operation_ref="dup/1").operation_ref
    queue, message = rt.app.messages.run(ref, 1)
    rt.redis.lpush(queue, message)

    env = rt.wait(ref, timeout=20)

    assert env.ok
    assert seen(provider, ref) == [1]
    assert effects(provider, ref) == 1
    assert wait_until(lambda: rt.ledger.stats().get("pay|duplicates_prevented", 0) >= 1, 10)


def test_concurrent_submits_of_the_same_refs_create_one_operation_each(rt: ToolQueue) -> None:
    refs = [f"burst/{i}" for i in range(50)]
    created: list[bool] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def submit(ref: str) -> None:
        try:
            s = rt.submit("pay", {"mode": "ok", "meta": {"k": ref}}, operation_ref=ref)
        except BaseException as exc:  # reported below, not lost in a thread
            with lock:
                failures.append(exc)
            return
        with lock:
            created.append(s.created)

    threads = [threading.Thread(target=submit, args=(r,)) for r in refs * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert failures == []
    assert len(created) == 200 and sum(created) == 50
    for ref in refs:
        assert rt.wait(ref, timeout=30).ok
    stats = rt.ledger.stats()
    assert stats["pay|submitted"] >= 50
    assert all(len(rt.redis.lrange(f"provider:seen:{r}", 0, -1)) == 1 for r in refs)


def test_a_read_tool_succeeds_without_verification(rt: ToolQueue) -> None:
    ref = rt.submit("lookup", {"mode": "r"}).operation_ref
    env = rt.wait(ref, timeout=20)

    assert env.ok and env.result == {"mode": "r"}
    # The attempt's own reply is the evidence: nothing looked the operation up...
    assert env.verification.evidence_ref is None
    rec = rt.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history] == [State.QUEUED, State.RUNNING, State.SUCCEEDED]
    # ...and no lookup of this read tool was ever asked for, in this whole module
    counted = {k for k in rt.ledger.stats() if k.startswith("lookup|")}
    assert counted.isdisjoint({"lookup|unknown", "lookup|verify_published", "lookup|lease_lost"})


@pytest.mark.parametrize(
    ("tool", "args", "code"),
    [
        ("nope", {}, "UNKNOWN_TOOL"),
        ("pay", {"amount_cents": "many"}, "INVALID_ARGUMENTS"),
        ("pay", ["not", "an", "object"], "INVALID_ARGUMENTS"),
        ("pay", {"meta": {"x": object()}}, "INVALID_ARGUMENTS"),
        ("pay", {"meta": {"blob": "x" * (300 * 1024)}}, "INVALID_ARGUMENTS"),
    ],
    ids=["unknown-tool", "fails-validation", "not-an-object", "not-json", "oversized"],
)
def test_bad_input_is_refused_at_submit_and_writes_nothing(
    rt: ToolQueue, tool: str, args: object, code: str
) -> None:
    stats = rt.ledger.stats()
    with pytest.raises(errors.RequestRefused) as info:
        rt.submit(tool, args, operation_ref=f"bad/{code}")
    assert info.value.code == code
    assert rt.get(f"bad/{code}") is None
    assert rt.redis.keys(f"*bad/{code}*") == []
    assert rt.ledger.stats() == stats


def test_a_reused_ref_with_other_arguments_is_refused_with_an_envelope(rt: ToolQueue) -> None:
    rt.submit("lookup", {"mode": "a"}, operation_ref="reuse/1")
    with pytest.raises(errors.IdempotencyKeyReused) as info:
        rt.submit("lookup", {"mode": "b"}, operation_ref="reuse/1")
    env = info.value.envelope
    assert env is not None and env.code == "IDEMPOTENCY_KEY_REUSED"
    rec = rt.get("reuse/1")
    assert rec is not None and rec.args == {
        "mode": "a",
        "amount_cents": 100,
        "sleep": 0.0,
        "meta": {},
    }
    # the same arguments (spelled differently) are the same call
    again = rt.submit("lookup", {"mode": "a", "amount_cents": "100"}, operation_ref="reuse/1")
    assert not again.created


def test_needs_input_refuses_identical_arguments_and_runs_changed_ones(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    ref = rt.submit("pay", {"mode": "invalid", "amount_cents": 0}).operation_ref
    env = rt.wait(ref, timeout=20)
    assert not env.ok and env.code == "INVALID_INPUT" and env.next_action == "correct_input"
    assert rt.get(ref).state is State.NEEDS_INPUT  # type: ignore[union-attr]

    with pytest.raises(errors.InvalidArguments):
        rt.provide_input(ref, {"mode": "invalid", "amount_cents": "0"})
    rt.provide_input(ref, {"mode": "invalid", "amount_cents": 5})
    env = rt.wait(ref, timeout=20)
    assert env.ok and env.result["attempt"] == 2
    assert effects(provider, ref) == 1


def test_an_approved_write_runs_as_approved(rt: ToolQueue) -> None:
    ref = rt.submit("pay", {"mode": "approval"}).operation_ref
    env = rt.wait(ref, timeout=20)
    assert not env.ok and env.next_action == "request_approval"
    rt.approve(ref)
    env = rt.wait(ref, timeout=20)
    assert env.ok and env.result["attempt"] == 2


def test_approval_is_bound_to_the_arguments_it_approved(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    # Given a write approved with arguments that then turned out to need fixing
    ref = rt.submit("pay", {"mode": "approval_then_input", "amount_cents": 0}).operation_ref
    assert rt.wait(ref, timeout=20).next_action == "request_approval"  # type: ignore[union-attr]
    rt.approve(ref)
    env = rt.wait(ref, timeout=20)
    assert not env.ok and env.code == "INVALID_INPUT"

    # When the arguments are replaced
    rt.provide_input(ref, {"mode": "approval_then_input", "amount_cents": 700})

    # Then the new arguments do not run as approved: they wait for an approval of their own
    env = rt.wait(ref, timeout=20)
    assert not env.ok and env.next_action == "request_approval"
    assert effects(provider, ref) == 0
    rt.approve(ref)
    env = rt.wait(ref, timeout=20)
    assert env.ok and env.result["attempt"] == 4
    told = [int(x) for x in provider.lrange(f"provider:approved:{ref}", 0, -1)]
    assert told == [0, 1, 0, 1]  # attempt 3 ran on new arguments, not approved
    assert effects(provider, ref) == 1
    approved = rt.ledger.fields(ref, "args", "fp", "approved_fp")
    assert approved["approved_fp"] == approved["fp"]
    assert json.loads(approved["args"])["amount_cents"] == 700


def test_wait_returns_the_current_envelope_or_raises_on_timeout(rt: ToolQueue) -> None:
    ref = rt.submit("pay", {"sleep": 1.5}).operation_ref
    with pytest.raises(TimeoutError):
        rt.wait(ref, timeout=0.2)
    assert rt.wait(ref, timeout=20).ok
    with pytest.raises(errors.OperationNotFound):
        rt.wait("no/such/ref", timeout=0.1)


def test_a_message_lost_before_any_worker_saw_it_is_published_again(rt: ToolQueue) -> None:
    # Given an operation queued in the ledger whose message never reached a
    # worker (a crash between BRPOP and kombu's unacked write loses it so)
    now = int(time.time() * 1000)
    canonical = '{"amount_cents":100,"meta":{},"mode":"lost","sleep":0.0}'
    rt.ledger.submit(
        ref="lost/1",
        tool="lookup",
        args_json=canonical,
        fp="f",
        call_id="",
        now_ms=now,
        max_attempts=3,
        deadline_ms=now + 60_000,
        state=State.QUEUED,
        due_ms=now + rt.app.policy.unclaimed_after_ms,
        queue="",
        message="",
    )
    # When no worker ever claims it, the scheduler publishes it again
    env = rt.wait("lost/1", timeout=20)
    assert env.ok and env.result == {"mode": "lost"}
    assert rt.ledger.stats()["lookup|republished"] == 1


def test_a_result_past_the_default_limit_is_not_kept_and_a_write_is_looked_up_not_run_again(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    # Given a read and a write whose results are past 1 MiB (the default limit)
    read = rt.submit("lookup", {"mode": "huge"}, operation_ref="huge/read").operation_ref
    write = rt.submit("pay", {"mode": "huge"}, operation_ref="huge/write").operation_ref
    # When a real worker runs them
    read_env = rt.wait(read, timeout=30)
    write_env = rt.wait(write, timeout=30)
    # Then the read failed, not retried, and waits for a person (the tool needs a fix)
    assert not read_env.ok and read_env.commit_state.value == "not_committed"
    assert read_env.code == "RESULT_TOO_LARGE"
    assert rt.get(read).state is State.ESCALATED  # type: ignore[union-attr]
    # ... and the write, which ran, was looked up: once, with the lookup's result kept
    assert write_env.ok and write_env.commit_state.value == "committed"
    assert write_env.result == {"paid": "huge/write", "found": True}
    assert effects(provider, write) == 1 and len(seen(provider, write)) == 1
    # ... and nothing of either result is in the ledger
    for ref in (read, write):
        assert len(rt.ledger.fields(ref, "envelope").get("envelope", "")) < 10_000
