"""A delivery whose claim the ledger's server does not take goes back to its queue.

The task bodies on fakeredis, the ledger's calls made to fail as a server away
fails (``redis.ConnectionError``): a claim that fails past its patience raises
``LedgerAway`` (the tool not called), which the Celery task turns into a requeue
(``Requeue``, a ``Reject``) that Celery logs on one line; a record that fails
after the tool ran raises ``RecordAway``, which the task turns into a requeue too: the
attempt stays held under a lease no longer renewed (its expiry settles it), and the
copy's claim finds it held and never calls the tool again.
The integration test with real processes: tests/integration/test_broker_outage.py.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from celery.exceptions import Reject
from pydantic import BaseModel, SecretStr

from toolq import CallContext, State, ToolQueue
from toolq.adapters.broker.messages import RUN_TASK, VERIFY_TASK, Requeue
from toolq.core.settings import ToolqSettings, WorkerSettings
from toolq.services.tasks import run as run_module
from toolq.services.tasks.run import LedgerAway, RecordAway


class Args(BaseModel):
    to: str = "x"


@pytest.fixture
def tq(fake_redis: fakeredis.FakeRedis) -> Iterator[ToolQueue]:
    # a short patience (its settings): what is tested is what happens after it
    worker = WorkerSettings(claim_patience_s=0.2, record_patience_s=0.2)
    settings = ToolqSettings(redis_url=SecretStr("redis://fake:6379/0"), worker=worker)
    now = [time.time()]  # moved by a test that waits out a lease
    q = ToolQueue(settings=settings, clock=lambda: now[0])
    q.now = now  # type: ignore[attr-defined]
    q.app._redis = fake_redis
    called: list[str] = []

    @q.tool(writes=True)
    def send(args: Args, ctx: CallContext) -> dict[str, Any]:
        called.append(f"send {ctx.operation_ref}")
        return {"sent": args.to}

    @send.verifier
    def find(ctx: CallContext) -> None:
        called.append(f"find {ctx.operation_ref}")

    q.called = called  # type: ignore[attr-defined]
    yield q
    q.close()


def away(*_: Any, **__: Any) -> Any:
    raise redis.ConnectionError("Error 111 connecting to 10.0.0.7:6379. Connection refused.")


def test_a_claim_the_server_does_not_take_raises_ledger_away_and_calls_nothing(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = tq.submit("send", {}, operation_ref="away/run").operation_ref
    monkeypatch.setattr(tq.app.ledger, "claim", away)

    with pytest.raises(LedgerAway) as raised:
        tq.runtime.run_attempt(ref, 1)

    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    assert str(raised.value) == (
        "away/run attempt 1: the ledger's server did not take the claim within 0.2 s "
        "(ConnectionError); the tool was not called"
    )  # the error's type, not its text (it names the server)
    assert tq.called == []  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert tq.app.ledger.fields(ref, "state")["state"] == State.QUEUED


def test_a_check_whose_claim_fails_raises_ledger_away_and_looks_nothing_up(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = tq.submit("send", {}, operation_ref="away/verify").operation_ref
    monkeypatch.setattr(tq.app.ledger, "claim", away)

    with pytest.raises(LedgerAway) as raised:
        tq.runtime.run_check(ref, 1, 1)

    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    assert tq.called == []  # type: ignore[attr-defined]


def test_a_record_that_fails_after_the_tool_ran_raises_record_away_and_calls_nothing_again(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim that succeeds, and the server gone before the outcome is recorded
    ref = tq.submit("send", {}, operation_ref="away/record").operation_ref
    apply_one = tq.app.ledger.apply_one
    monkeypatch.setattr(tq.app.ledger, "apply_one", away)

    # Then RecordAway, not the redis error (Celery logged that as "raised unexpected",
    # at ERROR, with its traceback), and not LedgerAway (the claim's: "not called")
    with pytest.raises(RecordAway) as raised:
        tq.runtime.run_attempt(ref, 1)
    assert not isinstance(raised.value, LedgerAway)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    assert str(raised.value) == (
        "away/record -> succeeded: the ledger's server did not take the record within 0.2 s "
        "(ConnectionError); the lease's expiry settles it"
    )
    assert tq.called == ["send away/record"]  # type: ignore[attr-defined]
    # the attempt stays running under its lease, which the keeper no longer renews
    assert tq.app.ledger.fields(ref, "state")["state"] == State.RUNNING
    assert tq.runtime.leases._held == {}

    # And the copy of the delivery, once the server answers, never calls the tool again:
    # its claim finds the attempt held (dropped while the lease lasts)
    monkeypatch.setattr(tq.app.ledger, "apply_one", apply_one)
    assert tq.runtime.run_attempt(ref, 1) == "duplicate"
    assert tq.called == ["send away/record"]  # type: ignore[attr-defined]


def test_a_copy_that_finds_the_lease_run_out_does_not_say_its_worker_died(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a record the server did not take: the worker lived, its delivery went back
    ref = tq.submit("send", {}, operation_ref="away/lease-out").operation_ref
    apply_one = tq.app.ledger.apply_one
    monkeypatch.setattr(tq.app.ledger, "apply_one", away)
    with pytest.raises(RecordAway):
        tq.runtime.run_attempt(ref, 1)
    monkeypatch.setattr(tq.app.ledger, "apply_one", apply_one)

    # When its copy comes once the lease has run out
    tq.now[0] += tq.settings.lease.seconds + 1  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="toolq.worker"):
        tq.runtime.run_attempt(ref, 1)

    # Then the write goes to verification, and the line says what happened: the lease
    # ran out (not "its worker died", which this one did not)
    assert tq.app.ledger.fields(ref, "state")["state"] == State.VERIFYING
    said = [r.getMessage() for r in caplog.records if r.name == "toolq.worker"]
    assert said == [
        f"{ref} attempt 1: its lease ran out (its worker died or lost the ledger's server "
        "mid-call); verifying"
    ]
    assert tq.called == ["send away/lease-out"]  # type: ignore[attr-defined]


def test_the_task_gives_back_a_delivery_whose_record_fails_in_one_warning_line(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ref = tq.submit("send", {}, operation_ref="away/task-record").operation_ref
    monkeypatch.setattr(tq.app.ledger, "apply_one", away)
    body = tq.app.celery.tasks[RUN_TASK]

    with caplog.at_level(logging.DEBUG, logger="celery"):
        result = body.apply(args=(ref, 1))

    assert str(result.state) == "REJECTED"  # requeued, not acknowledged
    lines = [r for r in caplog.records if r.name == "celery.app.trace"]
    assert len(lines) == 1, lines
    assert lines[0].levelno == logging.WARNING
    assert lines[0].exc_info is None and lines[0].exc_text is None
    assert f"requeued: {ref} -> succeeded: the ledger's server did not take the record" in (
        lines[0].getMessage()
    )
    assert "Traceback" not in caplog.text and "10.0.0.7" not in caplog.text
    assert "raised unexpected" not in caplog.text


def test_patience_counts_from_the_first_failure_not_the_first_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a first try that took longer than the whole patience and then failed
    # (a server stalled, then its reply lost), and a second that is answered
    now = [1000.0]
    monkeypatch.setattr(run_module.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(run_module.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    tries: list[float] = []

    def slow_then_answered() -> str:
        tries.append(now[0])
        if len(tries) == 1:
            now[0] += 90.0
            raise redis.TimeoutError("Timeout reading from socket")
        return "ok"

    # Then it is tried again, not given up on at once
    assert run_module._patient(slow_then_answered, 60.0) == "ok"
    assert len(tries) == 2

    # And a server away all along is still given up on after its patience
    def never() -> str:
        tries.append(now[0])
        raise redis.ConnectionError("refused")

    tries.clear()
    with pytest.raises(redis.ConnectionError):
        run_module._patient(never, 60.0)
    assert 55.0 <= tries[-1] - tries[0] <= 60.0


@pytest.mark.parametrize(("task", "args"), [(RUN_TASK, (1,)), (VERIFY_TASK, (1, 1))])
def test_the_task_gives_the_delivery_back_and_celery_says_it_in_one_line(
    tq: ToolQueue,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    task: str,
    args: tuple[int, ...],
) -> None:
    ref = tq.submit("send", {}, operation_ref=f"away/{task}").operation_ref
    monkeypatch.setattr(tq.app.ledger, "claim", away)
    body = tq.app.celery.tasks[task]

    # The body raises a Reject with requeue: Celery's tracer rejects the message with
    # requeue (late acks or not) instead of acknowledging it
    with pytest.raises(Reject) as raised:
        body(ref, *args)
    assert isinstance(raised.value, Requeue)
    assert raised.value.args[1] is True  # Reject(reason, requeue)
    # as a prefork child sends it to its parent, which rejects the message
    back = pickle.loads(pickle.dumps(raised.value))
    assert isinstance(back, Requeue) and back.args == raised.value.args

    # Celery's tracer (eager here, as in a worker's pool) logs it at WARNING, no traceback
    with caplog.at_level(logging.DEBUG, logger="celery"):
        result = body.apply(args=(ref, *args))
    assert str(result.state) == "REJECTED"
    lines = [r for r in caplog.records if r.name == "celery.app.trace"]
    assert len(lines) == 1, lines
    assert lines[0].levelno == logging.WARNING
    assert lines[0].exc_info is None and lines[0].exc_text is None
    said = lines[0].getMessage()
    assert f"[{result.id}] requeued: {ref} attempt 1: the ledger's server did not take" in said
    assert "Traceback" not in caplog.text and "10.0.0.7" not in caplog.text


def test_a_check_for_a_tool_this_worker_lacks_whose_ack_fails_is_given_back(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a write whose lease ran out (verifying), checked by a worker that does not
    # have its tool, and the server gone before that delivery is acknowledged
    ref = tq.submit("send", {}, operation_ref="away/unknown-tool").operation_ref
    apply_one = tq.app.ledger.apply_one
    monkeypatch.setattr(tq.app.ledger, "apply_one", away)
    with pytest.raises(RecordAway):
        tq.runtime.run_attempt(ref, 1)
    monkeypatch.setattr(tq.app.ledger, "apply_one", apply_one)
    tq.now[0] += tq.settings.lease.seconds + 1  # type: ignore[attr-defined]
    tq.runtime.run_attempt(ref, 1)
    assert tq.app.ledger.fields(ref, "state")["state"] == State.VERIFYING
    monkeypatch.delitem(tq.app.registry._tools, "send")
    monkeypatch.setattr(tq.app.ledger, "ack", away)

    # Then, past the claim's patience (a setting, not a fixed 10 s), the delivery goes
    # back as any claim the server did not take (a requeue), not a raw redis error
    with pytest.raises(LedgerAway) as raised:
        tq.runtime.run_check(ref, 1, 1, delivery="tag-1")
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    assert "within 0.2 s" in str(raised.value)
    assert tq.called == ["send away/unknown-tool"]  # type: ignore[attr-defined]
