"""The asyncio pool's hand-over from Celery's consumer thread to its loop
(toolq.services.workers.aio_pool): the wake-ups as a table, the future each delivery
gets, the tracer's arguments, and the threads started ahead.

The pool with real worker processes is in tests/integration/test_aio_pool*.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import dumps

from toolq.services.tasks.celery import AioBodies
from toolq.services.workers.aio_pool import AsyncioPool, Handover, _settled, started_threads


@pytest.mark.parametrize(
    ("steps", "wakes", "taken"),
    [
        # the first put wakes the loop; the ones before it takes them do not
        ("put put put take", [True, False, False], [["a", "b", "c"]]),
        # once it took them, the next put wakes it again
        ("put take put take", [True, True], [["a"], ["b"]]),
        # a wake-up that finds nothing (taken by an earlier one) is harmless
        ("put take take put take", [True, True], [["a"], [], ["b"]]),
        ("take put put take put", [True, False, True], [[], ["a", "b"]]),
    ],
)
def test_the_loop_is_woken_once_for_what_is_handed_over_before_it_takes(
    steps: str, wakes: list[bool], taken: list[list[str]]
) -> None:
    h = Handover()
    items = iter("abcdefgh")
    got_wakes: list[bool] = []
    got_taken: list[list[Any]] = []
    for step in steps.split():
        if step == "put":
            got_wakes.append(h.put(next(items)))
        else:
            got_taken.append(h.take())
    assert got_wakes == wakes
    assert got_taken == taken


def test_every_item_put_from_threads_is_taken_once_and_woken_for() -> None:
    """Given four threads putting while the loop's side takes, when they are done and
    it takes once more, then each item was taken once and none waited without a wake-up
    to come (every put that found none pending asked for one)."""
    h = Handover()
    wakes: list[bool] = []
    lock = threading.Lock()

    def put(base: int) -> None:
        for i in range(2000):
            w = h.put(base + i)
            with lock:
                wakes.append(w)

    threads = [threading.Thread(target=put, args=(k * 10_000,)) for k in range(4)]
    taken: list[Any] = []
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken += h.take()
    taken += h.take()
    assert sorted(taken) == sorted(k * 10_000 + i for k in range(4) for i in range(2000))
    assert any(wakes) and h.put("last") is True  # after the last take: a wake-up again


@pytest.mark.parametrize(
    ("outcome", "expect"),
    [("value", "value"), ("raises", ValueError), ("cancelled", concurrent.futures.CancelledError)],
)
def test_a_deliverys_future_gets_what_its_job_did(outcome: str, expect: Any) -> None:
    async def job() -> str:
        if outcome == "raises":
            raise ValueError("boom")
        if outcome == "cancelled":
            await asyncio.sleep(10)
        return "value"

    async def main() -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        task = asyncio.get_running_loop().create_task(_settled(job(), future))
        await asyncio.sleep(0)
        if outcome == "cancelled":
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return future

    future = asyncio.run(main())
    if isinstance(expect, type):
        with pytest.raises(expect):
            future.result(0)
    else:
        assert future.result(0) == expect


def test_the_pools_threads_are_started_ahead() -> None:
    ex = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ahead-test")
    try:
        started_threads(ex, 8)
        names = [t.name for t in threading.enumerate() if t.name.startswith("ahead-test")]
        assert len(names) == 8
    finally:
        ex.shutdown()


def test_the_tracer_gets_the_body_decoded_once_on_the_loop() -> None:
    """The body the loop decoded goes to Celery's tracer with no content type (its
    tracer then takes it as it is); a body the loop could not run keeps the message's."""
    app = Celery("handover-test", set_as_current=False)
    seen: list[tuple[Any, ...]] = []

    async def body(rt: Any, delivery: Any, ref: str, attempt: int) -> str:
        seen.append((ref, attempt))
        return "succeeded"

    pool = AsyncioPool(limit=1, app=app)
    pool._runtime = lambda aio: None  # type: ignore[method-assign,assignment,return-value]
    aio = AioBodies(runtime=lambda: None, ledger=lambda: None, body=body)  # type: ignore[arg-type,return-value]
    content_type, encoding, raw = dumps(((["op_1", 2], {}, {})), "json")
    args = ("toolq.run", "id-1", {}, raw, content_type, encoding, "extra")

    done, ok, embed, traced = asyncio.run(pool._serve(aio, args))
    assert ok and done() == "succeeded" and seen == [("op_1", 2)] and embed == {}
    assert traced[:3] == args[:3] and traced[6:] == ("extra",)
    assert list(traced[3]) == [["op_1", 2], {}, {}] and traced[4:6] == (None, None)

    bad = ("toolq.run", "id-2", {}, b"not json", content_type, encoding)
    done, ok, embed, traced = asyncio.run(pool._serve(aio, bad))
    assert not ok and traced == bad
