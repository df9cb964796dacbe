"""The asyncio pool's lean success (:mod:`toolq.services.workers.lean`) with a real
worker (``-P asyncio -c 16``): plain calls end without Celery's tracer and leave nothing
unacknowledged; a message that asks for its result goes through the tracer; a revoked
one is discarded by Celery's strategy before the pool sees it; with task events on
(``-E``), a lean success still sends ``task-succeeded``. The pool's counts are
read with Celery's ``inspect stats`` (the pool's info), once they reached what the test
expects (:func:`_counted`): the ledger's record of a call also acknowledges its delivery,
and only then does the pool's loop go on to count it. The decisions as a table:
tests/unit/test_aio_lean_success.py."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import start_worker, stop_process, wait_until
from tests.integration.apps import aio_pool_app
from toolq import ToolQueue
from toolq.adapters.broker.messages import RUN_TASK
from toolq.core.keys import KOMBU_UNACKED
from toolq.core.text import as_text

APP = "tests.integration.apps.aio_pool_app:tq"


@pytest.fixture(scope="module")
def aq(module_redis_url: str) -> Iterator[ToolQueue]:
    tq = aio_pool_app.tq
    tq.configure(redis_url=module_redis_url)
    yield tq
    tq.close()


@pytest.fixture(scope="module")
def worker(aq: ToolQueue, module_redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_worker(APP, module_redis_url, pool="asyncio", concurrency=16)
    yield proc
    stop_process(proc)


def _pool(tq: ToolQueue) -> dict[str, Any]:
    """The worker's pool info (``celery inspect stats``); one worker serves the module,
    so the first reply is the answer (``limit=1``: not the whole ``timeout`` each time)."""
    stats: dict[str, Any] = {}

    def answered() -> bool:
        stats.update(tq.celery.control.inspect(timeout=2.0, limit=1).stats() or {})
        return len(stats) == 1

    assert wait_until(answered, 30), "the worker did not answer inspect stats"
    return dict(next(iter(stats.values()))["pool"])


def _counted(tq: ToolQueue, count: str, least: int) -> dict[str, Any]:
    """The worker's pool info once its ``count`` reached ``least`` (or as it stands
    after 30 s: the caller's assertion then says what it found). A call is done and
    its delivery acknowledged in the ledger (one script) before the pool's loop reads
    that script's reply and counts the call: a count read as soon as the ledger says
    done may not hold it yet, nor, after a batch of records, any call of that batch."""
    pool: dict[str, Any] = {}

    def reached() -> bool:
        pool.update(_pool(tq))
        return int(pool[count]) >= least

    wait_until(reached, 30)
    return pool


def _settled(tq: ToolQueue) -> bool:
    """Nothing of the calls queue waits or is unacknowledged (``inspect``'s own replies,
    in kombu's unacked hash too, are not the worker's)."""
    r, calls = tq.redis, tq.settings.queues.calls
    unacked = [json.loads(v)[2] for v in r.hvals(KOMBU_UNACKED)]
    return calls not in unacked and r.llen(calls) == 0


def test_plain_calls_end_on_the_lean_path_and_are_acknowledged(
    aq: ToolQueue, worker: subprocess.Popen[bytes]
) -> None:
    before = _pool(aq)
    assert before["lean"] is True
    # Given async and def tool calls, nothing watching Celery's tracer (ten at once: their
    # records go in batches; never more in flight than -c, which is the pool's threads,
    # so every tracer would run inline: traced_inline)
    refs = [aq.submit("await_slowly", {"seconds": 0}).operation_ref for _ in range(5)]
    refs += [aq.submit("sync_read", {"seconds": 0}).operation_ref for _ in range(5)]
    envs = [aq.wait(ref, timeout=60) for ref in refs]

    # Then every one succeeded, through the lean path, and its delivery was acknowledged
    assert all(env.ok for env in envs), [env for env in envs if not env.ok][:2]
    assert wait_until(lambda: _settled(aq), 20)
    after = _counted(aq, "lean-successes", before["lean-successes"] + len(refs))
    # (on failure: which workers beat on this database; one was expected)
    beating = sorted(as_text(k) for k in aq.redis.hkeys(aq.app.ledger.keys.worker_nodes))
    assert after["lean-successes"] - before["lean-successes"] == len(refs), (before, after, beating)
    assert after["traced"] == before["traced"], (before, after, beating)


def test_a_message_asking_for_its_result_goes_through_celerys_tracer(
    aq: ToolQueue, worker: subprocess.Popen[bytes]
) -> None:
    first = _pool(aq)
    ref = aq.submit("await_slowly", {"seconds": 0}).operation_ref
    assert aq.wait(ref, timeout=60).ok
    assert wait_until(lambda: _settled(aq), 20)
    before = _counted(aq, "lean-successes", first["lean-successes"] + 1)

    # When a second delivery of the call comes as a message that asks for its result
    aq.celery.send_task(
        RUN_TASK, args=(ref, 1), queue=aq.settings.queues.calls, ignore_result=False
    )

    # Then Celery's tracer ran it (the claim refused it: the call ran once) and it was acked
    assert wait_until(lambda: _pool(aq)["traced"] == before["traced"] + 1, 30)
    assert wait_until(lambda: _settled(aq), 20)
    assert _pool(aq)["lean-successes"] == before["lean-successes"]
    rec = aq.get(ref)
    assert rec is not None and rec.attempt == 1


def test_a_revoked_message_is_discarded_before_the_pool(
    aq: ToolQueue, worker: subprocess.Popen[bytes]
) -> None:
    first = _pool(aq)
    ref = aq.submit("await_slowly", {"seconds": 0}).operation_ref
    assert aq.wait(ref, timeout=60).ok
    assert wait_until(lambda: _settled(aq), 20)
    before = _counted(aq, "lean-successes", first["lean-successes"] + 1)

    # Given a task id the worker was told to revoke
    task_id = f"lean-revoked-{uuid.uuid4()}"
    aq.celery.control.revoke(task_id)

    def revoked() -> bool:
        answers = aq.celery.control.inspect(timeout=2.0, limit=1).revoked() or {}
        return any(task_id in ids for ids in answers.values())

    assert wait_until(revoked, 30)
    # When a message with that id comes
    aq.celery.send_task(RUN_TASK, args=(ref, 1), queue=aq.settings.queues.calls, task_id=task_id)

    # Then Celery's strategy discarded (and acknowledged) it: the pool never saw it
    assert wait_until(lambda: _settled(aq), 30)
    after = _pool(aq)
    assert (after["lean-successes"], after["traced"]) == (
        before["lean-successes"],
        before["traced"],
    )


def test_with_task_events_on_a_lean_success_still_sends_task_succeeded(
    aq: ToolQueue, module_redis_url: str, worker: subprocess.Popen[bytes]
) -> None:
    # Given a second worker, with task events on (the module's worker is stopped meanwhile
    # so that this one takes the call)
    stop_process(worker)
    events: list[dict[str, Any]] = []
    receivers: list[Any] = []
    ready = threading.Event()

    def capture() -> None:
        with aq.celery.connection_for_read() as conn:
            recv = aq.celery.events.Receiver(conn, handlers={"*": events.append})
            receivers.append(recv)
            ready.set()
            recv.capture(limit=None, timeout=None, wakeup=False)  # until should_stop

    listener = threading.Thread(target=capture, daemon=True)
    listener.start()
    assert ready.wait(10)
    evented = start_worker(APP, module_redis_url, pool="asyncio", concurrency=16, extra_args=["-E"])
    try:
        ref = aq.submit("await_slowly", {"seconds": 0}).operation_ref
        assert aq.wait(ref, timeout=60).ok

        # Then the worker sent the call's task-started and task-succeeded events
        def succeeded() -> bool:
            return any(e.get("type") == "task-succeeded" for e in list(events))

        assert wait_until(succeeded, 30), [e.get("type") for e in events]
        assert wait_until(lambda: _settled(aq), 20)
        pool = _counted(aq, "lean-successes", 1)
        assert pool["lean-successes"] >= 1 and pool["traced"] == 0, pool
    finally:
        receivers[0].should_stop = True
        listener.join(10)
        stop_process(evented)
