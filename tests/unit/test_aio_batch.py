"""The asyncio ledger's batches (toolq.adapters.ledger.aio_batch): tables for the pure
pieces, a gated fake sender for the batcher's loop, and the ledger on fakeredis.

Real worker processes, a durable server and a SIGKILL mid-batch are in
tests/integration/test_aio_batches.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis
from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.adapters.ledger.aio_batch import Batcher, deliver, fail, read_round, take
from toolq.core import errors
from toolq.core.keys import KOMBU_UNACKED
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition

NOSCRIPT = redis.exceptions.NoScriptError("No matching script")
BROKEN = redis.ResponseError("ERR something in the script")
NOT_DURABLE = errors.NotDurable("not on disk")


def _run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# ----------------------------------------------------------------------------- read_round


def _settle_raising(exc: Exception | None, seen: list[Sequence[Any]]) -> Callable[..., None]:
    def settle(waits: Sequence[Any]) -> None:
        seen.append(list(waits))
        if exc is not None:
            raise exc

    return settle


@pytest.mark.parametrize(
    ("replies", "n", "resend", "waits_fail", "answers", "again", "settled"),
    [
        # every call ran, the wait holds: each its own reply
        (["a", "b", 1], 2, True, False, ["a", "b"], [], True),
        # no wait sent (a plan that does not wait): the same
        (["a", "b"], 2, True, False, ["a", "b"], [], True),
        # the server lost the scripts for one: it is sent again, the others answered
        (["a", NOSCRIPT, 1], 2, True, False, ["a", NOSCRIPT], [1], True),
        # ... but not a second time: then its caller gets the error
        (["a", NOSCRIPT, 1], 2, False, False, ["a", NOSCRIPT], [], True),
        # an error of one call is that caller's alone
        (["a", BROKEN, 1], 2, True, False, ["a", BROKEN], [], True),
        # the wait fails: every call that ran gets its error; a failed one keeps its own
        (["a", BROKEN, "c", 0], 3, True, True, [NOT_DURABLE, BROKEN, NOT_DURABLE], [], True),
        # ... and one sent again is confirmed by its own round, not this one
        (["a", NOSCRIPT, 0], 2, True, True, [NOT_DURABLE, NOSCRIPT], [1], True),
        # nothing ran: the wait is not read (the calls' errors are the answers)
        ([BROKEN, NOSCRIPT, 0], 2, True, True, [BROKEN, NOSCRIPT], [1], False),
    ],
)
def test_a_round_answers_each_call_with_its_own_reply(
    replies: list[Any],
    n: int,
    resend: bool,
    waits_fail: bool,
    answers: list[Any],
    again: list[int],
    settled: bool,
) -> None:
    seen: list[Sequence[Any]] = []
    got, resent = read_round(
        replies, n, resend, _settle_raising(NOT_DURABLE if waits_fail else None, seen)
    )
    assert got == answers and resent == again
    assert seen == ([replies[n:]] if settled else [])


# ----------------------------------------------------------------------------- take, deliver


def test_take_skips_callers_gone_and_stops_at_the_limit() -> None:
    async def body() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(6)]
        futs[1].cancel()
        futs[3].cancel()
        pending = deque(zip(range(6), futs, strict=True))
        batch = take(pending, 3)
        return [i for i, _ in batch], [i for i, _ in pending]

    assert _run(body) == ([0, 2, 4], [5])


def test_deliver_gives_each_caller_its_answer_and_skips_one_gone() -> None:
    async def body() -> list[str]:
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(4)]
        futs[2].cancel()
        deliver(list(zip(range(4), futs, strict=True)), ["ok", BROKEN, "x", "queued"])
        return ["cancelled" if f.cancelled() else repr(f.exception() or f.result()) for f in futs]

    assert _run(body) == ["'ok'", repr(BROKEN), "cancelled", "'queued'"]


def test_too_few_answers_fail_every_caller_rather_than_misplace_one() -> None:
    async def body() -> list[bool]:
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(3)]
        deliver(list(zip(range(3), futs, strict=True)), ["ok", "ok"])
        return [isinstance(f.exception(), RuntimeError) for f in futs]

    assert _run(body) == [True, True, True]


def test_fail_cancels_on_a_cancellation_and_raises_anything_else() -> None:
    async def body() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        a: asyncio.Future[Any] = loop.create_future()
        b: asyncio.Future[Any] = loop.create_future()
        fail([(0, a)], asyncio.CancelledError())
        fail([(1, b)], redis.ConnectionError("gone"))
        return a.cancelled(), isinstance(b.exception(), redis.ConnectionError)

    assert _run(body) == (True, True)


# ----------------------------------------------------------------------------- the batcher


class Gate:
    """A fake sender: records each batch, answers ``answer(item)`` once released."""

    def __init__(self, answer: Callable[[int], Any] = lambda i: i * 10) -> None:
        self.sent: list[list[int]] = []
        self.turns = asyncio.Semaphore(0)
        self.answer = answer
        self.raise_next: Exception | None = None

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.turns.release()

    async def __call__(self, items: list[int]) -> list[Any]:
        self.sent.append(list(items))
        await self.turns.acquire()
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        return [self.answer(i) for i in items]


async def _outcomes(tasks: Sequence[asyncio.Task[Any]]) -> list[Any]:
    got = await asyncio.gather(*tasks, return_exceptions=True)
    return [type(g).__name__ if isinstance(g, BaseException) else g for g in got]


def _start(b: Batcher[int, int], items: Sequence[int]) -> list[asyncio.Task[Any]]:
    return [asyncio.create_task(b(i)) for i in items]


def test_calls_asked_while_one_is_out_go_together_in_the_next_batch() -> None:
    async def body() -> tuple[list[list[int]], list[Any], int, int]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate, limit=256)
        tasks = _start(b, [1, 2, 3, 4, 5])
        await _turns()
        assert gate.sent == [[1]]  # the first at once, alone; one round trip out at a time
        gate.release(2)
        return gate.sent, await _outcomes(tasks), b.batches, b.calls

    sent, got, batches, calls = _run(body)
    assert sent == [[1], [2, 3, 4, 5]]
    assert got == [10, 20, 30, 40, 50]
    assert (batches, calls) == (2, 5)


def test_a_batch_is_bounded() -> None:
    async def body() -> tuple[list[list[int]], list[Any]]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate, limit=4)
        tasks = _start(b, range(11))
        await _turns()
        gate.release(4)
        return gate.sent, await _outcomes(tasks)

    sent, got = _run(body)
    assert [len(s) for s in sent] == [1, 4, 4, 2]
    assert got == [i * 10 for i in range(11)]


def test_an_error_answering_one_call_reaches_that_caller_alone() -> None:
    def answer(i: int) -> Any:
        return BROKEN if i in (1, 3) else i * 10

    async def body() -> tuple[list[Any], list[list[int]]]:
        gate = Gate(answer)
        b: Batcher[int, int] = Batcher(gate)
        tasks = _start(b, [1, 2, 3, 4, 5])
        await _turns()
        gate.release(2)
        return await _outcomes(tasks), gate.sent

    # alone (1) or in a batch (3): the caller whose call failed, no other
    got, sent = _run(body)
    assert got == ["ResponseError", 20, "ResponseError", 40, 50]
    assert sent == [[1], [2, 3, 4, 5]]


@pytest.mark.parametrize("first_fails", [True, False])
def test_a_failed_round_trip_fails_its_callers_and_the_next_batch_goes_on(
    first_fails: bool,
) -> None:
    async def body() -> tuple[list[Any], list[list[int]]]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate)
        if first_fails:  # the lone call's round trip
            gate.raise_next = redis.ConnectionError("connection lost")
        tasks = _start(b, [1, 2, 3])
        await _turns()
        gate.release()
        await _turns()
        if not first_fails:  # the batch's
            gate.raise_next = redis.ConnectionError("connection lost")
        gate.release()
        await _turns()
        tasks += _start(b, [4, 5])
        gate.release(2)
        return await _outcomes(tasks), gate.sent

    got, sent = _run(body)
    lost = "ConnectionError"
    assert got == ([lost, 20, 30, 40, 50] if first_fails else [10, lost, lost, 40, 50])
    assert sent == [[1], [2, 3], [4], [5]]


def test_a_caller_cancelled_while_its_batch_is_out_loses_only_its_own_answer() -> None:
    async def body() -> tuple[list[Any], list[list[int]]]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate)
        tasks = _start(b, [1, 2, 3, 4])
        await _turns()
        gate.release()
        await _turns()
        assert gate.sent == [[1], [2, 3, 4]]
        tasks[2].cancel()  # its batch is out
        await _turns()
        gate.release()
        return await _outcomes(tasks), gate.sent

    got, sent = _run(body)
    assert got == [10, 20, "CancelledError", 40]
    assert sent == [[1], [2, 3, 4]]


def test_a_lone_caller_cancelled_mid_call_leaves_the_waiting_ones_served() -> None:
    async def body() -> tuple[list[Any], list[list[int]]]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate)
        tasks = _start(b, [1, 2, 3])
        await _turns()
        tasks[0].cancel()  # the lone call out, from its own task
        await _turns()
        gate.release(2)
        return await _outcomes(tasks), gate.sent

    got, sent = _run(body)
    assert got == ["CancelledError", 20, 30]
    assert sent == [[1], [2, 3]]


def test_a_caller_cancelled_before_its_batch_left_is_not_sent() -> None:
    async def body() -> tuple[list[Any], list[list[int]]]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate)
        tasks = _start(b, [1, 2, 3, 4])
        await _turns()
        tasks[1].cancel()
        await _turns()
        gate.release(2)
        return await _outcomes(tasks), gate.sent

    got, sent = _run(body)
    assert got == [10, "CancelledError", 30, 40]
    assert sent == [[1], [3, 4]]


def test_closing_the_batcher_cancels_whoever_still_waits_and_it_starts_again() -> None:
    async def body() -> tuple[list[Any], int]:
        gate = Gate()
        b: Batcher[int, int] = Batcher(gate)
        tasks = _start(b, [1, 2, 3, 4])
        await _turns()
        gate.release()
        await _turns()  # [2, 3, 4] out on the batcher's task
        tasks += _start(b, [5])
        await _turns()
        await b.aclose()
        got = await _outcomes(tasks)
        gate.release()
        return got, await b(7)

    got, again = _run(body)
    assert got == [10] + ["CancelledError"] * 4
    assert again == 70


def test_a_lone_call_goes_its_own_way_when_the_batcher_has_one() -> None:
    async def body() -> tuple[list[Any], list[list[int]], list[int]]:
        gate = Gate()
        alone: list[int] = []

        async def one(i: int) -> int:
            alone.append(i)
            if i == 9:
                raise BROKEN
            await gate.turns.acquire()
            return -i

        b: Batcher[int, int] = Batcher(gate, one=one)
        tasks = _start(b, [1, 2, 3])
        await _turns()
        gate.release(2)
        got = await _outcomes(tasks)
        return got + await _outcomes(_start(b, [9])), gate.sent, alone

    got, sent, alone = _run(body)
    assert got == [-1, 20, 30, "ResponseError"]
    assert sent == [[2, 3]] and alone == [1, 9]


# ----------------------------------------------------------------------------- the ledger


class Empty(BaseModel):
    pass


@pytest.fixture
def fake() -> tuple[ToolQueue, fakeredis.FakeServer]:
    server = fakeredis.FakeServer()
    q = ToolQueue(redis_url="redis://fake:6379/0")
    q.app._redis = fakeredis.FakeRedis(server=server)

    @q.tool(writes=False)
    def noop(args: Empty, ctx: CallContext) -> dict[str, int]:
        return {}

    return q, server


def test_the_ledgers_claims_and_records_in_batches_answer_each_caller(
    fake: tuple[ToolQueue, fakeredis.FakeServer],
) -> None:
    tq, server = fake
    refs = [tq.submit("noop", {}, operation_ref=f"b/{i}").operation_ref for i in range(10)]
    tq.cancel(refs[4])  # its claim is refused: its caller alone hears it
    for i in range(10):
        tq.redis.hset(KOMBU_UNACKED, f"tag-{i}", "message")
    now = tq.runtime.now_ms()

    async def body() -> tuple[list[Any], list[str], int, int]:
        client = fakeredis.aioredis.FakeRedis(server=server)
        ledger = AsyncLedger(client, layout=tq.app.topology.layout, batch=4)
        assert ledger.batches is not None
        claims = await asyncio.gather(
            *(ledger.claim(r, 1, f"w:{i}", now, 30_000, ack=f"tag-{i}") for i, r in enumerate(refs))
        )
        records = await asyncio.gather(
            *(
                ledger.apply_one(
                    Transition(
                        ref=r,
                        states=(State.RUNNING,),
                        to=State.SUCCEEDED,
                        by=f"w:{i}",
                        expect={"running": {"lease_holder": f"w:{i}"}},
                    ),
                    now,
                    f"tag-{i}",
                )
                for i, r in enumerate(refs)
            )
        )
        batches = ledger.batches.waited.batches + ledger.batches.plain.batches
        calls = ledger.batches.waited.calls + ledger.batches.plain.calls
        await client.aclose()
        return [(c.outcome, c.state) for c in claims], records, batches, calls

    claims, records, batches, calls = _run(body)
    assert [c[0] for c in claims] == ["claimed"] * 4 + ["stale"] + ["claimed"] * 5
    assert claims[4][1] == "cancelled"
    assert records == ["ok"] * 4 + ["cancelled"] + ["ok"] * 5
    # 10 claims and 10 records, at most 4 to a round trip
    assert calls == 20 and batches == 8  # each: 1 alone, then 4 + 4 + 1
    assert tq.redis.hlen(KOMBU_UNACKED) == 0  # each call acknowledged its own delivery
    for i, ref in enumerate(refs):
        rec = tq.get(ref)
        assert rec is not None
        if i != 4:
            assert rec.state is State.SUCCEEDED
            assert rec.history[1].by == f"w:{i}"
    tq.close()
