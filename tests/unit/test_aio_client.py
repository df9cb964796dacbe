"""``tq.aio`` on fakeredis: how a wait uses notices, reads, progress and cancellation.

The worker side runs in-process (``tq.runtime.run_attempt`` in a thread) on a
sync fakeredis client sharing the async client's server, so the notices the
scripts publish reach the async subscription as they would from a worker.
Processes, a real server and its restart are in tests/integration/test_aio.py.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis
from pydantic import BaseModel

from tests.helpers import run_aio, until_async, wait_until
from toolq import CallContext, ToolQueue
from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.adapters.notify import (
    PROGRESS_PAUSE_S,
    Event,
    Progress,
    ProgressPublisher,
    progress_notice,
    to_event,
)
from toolq.core import errors
from toolq.core.states import State
from toolq.decisions import operations
from toolq.decisions.operations import Seen
from toolq.decisions.recovery import operator
from toolq.decisions.recovery.transition import Transition


class Args(BaseModel):
    n: int = 0
    steps: list[float] = []


@pytest.fixture
def tq(monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolQueue]:
    server = fakeredis.FakeServer()
    q = ToolQueue(redis_url="redis://fake:6379/0")
    q.app._redis = fakeredis.FakeRedis(server=server)
    monkeypatch.setattr(
        q.app, "async_redis", lambda **_: fakeredis.aioredis.FakeRedis(server=server)
    )

    @q.tool(writes=False)
    def noop(args: Args, ctx: CallContext) -> dict[str, int]:
        for fraction in args.steps:
            ctx.progress(fraction, f"at {fraction}")
        return {"n": args.n}

    @q.tool(requires_approval=True)
    def guarded(args: Args) -> dict[str, int]:
        return {"n": args.n}

    yield q
    q.close()


async def worker(tq: ToolQueue, ref: str) -> str:
    """Serve attempt 1 of ``ref`` as a worker would (off the loop: it is sync)."""
    return await asyncio.to_thread(tq.runtime.run_attempt, ref, 1)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The refs of every record read a waiter makes from now on (async and sync ledger)."""
    got: list[str] = []
    real_async, real_sync = AsyncLedger.fields, Ledger.fields

    async def read_async(self: AsyncLedger, ref: str, *names: str) -> dict[str, str]:
        fields = await real_async(self, ref, *names)
        got.append(ref)  # once read: a test that changes the record next is not read yet
        return fields

    def read_sync(self: Ledger, ref: str, *names: str) -> dict[str, str]:
        got.append(ref)
        return real_sync(self, ref, *names)

    monkeypatch.setattr(AsyncLedger, "fields", read_async)
    monkeypatch.setattr(Ledger, "fields", read_sync)
    return got


# ----------------------------------------------------------------------------- waiting


def test_a_call_that_created_its_operation_reads_nothing_until_it_returns(
    tq: ToolQueue, reads: list[str]
) -> None:
    async def body() -> Any:
        call = asyncio.create_task(tq.aio.call("noop", {"n": 4}, operation_ref="c/1"))
        await until_async(lambda: tq.get("c/1"))
        assert await worker(tq, "c/1") == "succeeded"
        return await call

    env = run_aio(tq, body)
    assert env.ok and env.result == {"n": 4}
    assert reads == []  # the notice carried the envelope; the submit said "created"


def test_a_wait_reads_once_then_takes_the_outcome_from_the_notice(
    tq: ToolQueue, reads: list[str]
) -> None:
    async def body() -> Any:
        ref = (await tq.aio.submit("noop", {"n": 1})).operation_ref
        waiting = asyncio.create_task(tq.aio.wait(ref, timeout=10))
        await until_async(lambda: reads)
        assert await worker(tq, ref) == "succeeded"  # running, then succeeded: two notices
        return await waiting

    env = run_aio(tq, body)
    assert env.ok and env.result == {"n": 1}
    assert len(reads) == 1


def test_a_notice_that_was_lost_is_made_up_for_by_the_fallback_read(
    tq: ToolQueue, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("toolq.client.aio.FALLBACK_READ_S", 0.05)
    env_json = '{"ok":true,"operation_ref":"f/1","operation":"noop","commit_state":"committed",'
    env_json += '"result":{"n":9},"verification":{"checked_at":"2026-01-01T00:00:00Z"}}'

    async def body() -> Any:
        await tq.aio.submit("noop", {"n": 9}, operation_ref="f/1")
        waiting = asyncio.create_task(tq.aio.wait("f/1", timeout=10))
        await until_async(lambda: reads)
        # The record settles with no notice at all (as if the PUBLISH never reached us).
        settled = {"state": "succeeded", "rev": 5, "envelope": env_json}
        tq.redis.hset(tq.ledger.keys.op("f/1"), mapping=settled)
        return await waiting

    env = run_aio(tq, body)
    assert env.ok and env.result == {"n": 9}
    assert len(reads) >= 2


def test_a_wait_times_out_with_the_current_error_or_timeout_error(tq: ToolQueue) -> None:
    async def body() -> Any:
        ref = (await tq.aio.submit("noop", {})).operation_ref
        with pytest.raises(TimeoutError):
            await tq.aio.wait(ref, timeout=0.05)
        # approval required before the first attempt: settled at once, with its envelope
        ref2 = (await tq.aio.submit("guarded", {})).operation_ref
        return await tq.aio.wait(ref2, timeout=0)

    env = run_aio(tq, body)
    assert not env.ok and env.code == "MISSING_APPROVAL"


def test_cancelling_the_waiting_task_ends_the_wait_only(tq: ToolQueue) -> None:
    async def body() -> Any:
        call = asyncio.create_task(tq.aio.call("noop", {"n": 2}, operation_ref="x/1"))
        await until_async(lambda: tq.get("x/1") and tq.aio.watching() == 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert tq.aio.watching() == 0
        assert tq.get("x/1").state is State.QUEUED  # type: ignore[union-attr]
        assert await worker(tq, "x/1") == "succeeded"
        return await tq.aio.wait("x/1", timeout=5)

    env = run_aio(tq, body)
    assert env.ok and env.result == {"n": 2}


# ----------------------------------------------------------------------------- progress and watch


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_progress_reaches_on_progress(tq: ToolQueue, kind: str) -> None:
    heard: list[Progress] = []

    def plain(p: Progress) -> None:
        heard.append(p)

    async def awaited(p: Progress) -> None:
        await asyncio.sleep(0)
        heard.append(p)

    async def body() -> Any:
        args = {"steps": [1.0]}  # the final word always travels, whatever the rate limit
        call = asyncio.create_task(
            tq.aio.call(
                "noop", args, operation_ref="p/1", on_progress=plain if kind == "plain" else awaited
            )
        )
        await until_async(lambda: tq.get("p/1"))
        await worker(tq, "p/1")
        return await call

    assert run_aio(tq, body).ok
    assert heard == [Progress(1.0, "at 1.0")]


def test_watch_follows_every_state_and_progress_and_ends_settled(tq: ToolQueue) -> None:
    async def body() -> list[Event]:
        ref = (await tq.aio.submit("noop", {"steps": [1.0]}, operation_ref="w/1")).operation_ref
        seen: list[Event] = []
        async for ev in tq.aio.watch(ref):
            seen.append(ev)
            if len(seen) == 1:
                asyncio.get_running_loop().create_task(worker(tq, ref))
        assert tq.aio.watching() == 0
        history = await tq.aio.history(ref)
        for ev in seen:
            if ev.kind == "state":
                assert history[ev.seq - 1].to == ev.state
        assert await tq.aio.history(ref, after=2) == history[2:]
        return seen

    seen = run_aio(tq, body)
    assert [(e.kind, e.state, e.rev) for e in seen] == [
        ("state", State.QUEUED, 1),
        ("state", State.RUNNING, 2),
        ("progress", None, 0),
        ("state", State.SUCCEEDED, 3),
    ]
    assert seen[2].progress == Progress(1.0, "at 1.0")
    # The envelope is the model; the JSON the ledger stored is kept beside it
    envelope = seen[3].envelope
    assert envelope is not None and envelope.ok and envelope.operation_ref == "w/1"
    assert '"ok":true' in seen[3].envelope_json
    assert seen[0].envelope is None and seen[0].envelope_json == ""


def test_the_worker_publishes_progress_at_most_ten_a_second_and_always_the_last(
    tq: ToolQueue,
) -> None:
    sub = tq.redis.pubsub()
    sub.ssubscribe(tq.ledger.keys.notify_steps)  # where progress goes, with unsettled states
    ref = tq.submit("noop", {"steps": [0.1, 0.2, 0.3, 1.0]}).operation_ref
    assert tq.runtime.run_attempt(ref, 1) == "succeeded"
    tq.redis.spublish(tq.ledger.keys.notify_steps, "end")  # what follows the last notice
    texts: list[str] = []
    while not texts or texts[-1] != "end":
        msg = sub.get_message(timeout=5)
        assert msg is not None
        if msg["type"] == "smessage":
            texts.append(msg["data"].decode())
    sub.close()
    progress = [t for t in texts if t.startswith("progress ")]
    # four reports within microseconds: the first, then the final 1.0
    assert progress == [
        f'progress {ref}\n{{"fraction":0.1,"message":"at 0.1"}}',
        f'progress {ref}\n{{"fraction":1.0,"message":"at 1.0"}}',
    ]


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_refused_with_typed_errors_and_nothing_written(tq: ToolQueue) -> None:
    before = set(tq.redis.keys("*"))

    async def body() -> None:
        aio = tq.aio
        refusals: list[tuple[type[Exception], Callable[[], Awaitable[Any]]]] = [
            (errors.UnknownTool, lambda: aio.submit("nosuch", {})),
            (errors.UnknownTool, lambda: aio.call("nosuch", {})),
            (errors.InvalidArguments, lambda: aio.submit("noop", {"n": "x"})),
            (errors.InvalidArguments, lambda: aio.submit("noop", [])),
            (errors.InvalidArguments, lambda: aio.call("noop", {}, operation_ref="bad ref")),
            (errors.InvalidArguments, lambda: aio.submit("noop", {}, operation_ref="./a/b")),
            (errors.InvalidArguments, lambda: aio.submit("noop", {}, operation_ref="a//b")),
            (errors.InvalidArguments, lambda: aio.submit("noop", {}, call_id="c" * 500)),
            (errors.OperationNotFound, lambda: aio.wait("nosuch/1", timeout=1)),
            (errors.OperationNotFound, lambda: aio.wait("bad ref\n", timeout=1)),
            (errors.OperationNotFound, lambda: aio.history("nosuch/1")),
            (errors.InvalidArguments, lambda: aio.history("nosuch/1", after=-1)),
            (errors.OperationNotFound, lambda: aio.approve("nosuch/1")),
            (errors.OperationNotFound, lambda: aio.provide_input("nosuch/1", {})),
            (errors.OperationNotFound, lambda: aio.cancel("nosuch/1")),
            (errors.OperationNotFound, lambda: anext(aio.watch("nosuch/1"))),
            (errors.OperationNotFound, lambda: aio.cancel(None)),  # type: ignore[arg-type]
            (TypeError, lambda: aio.wait("nosuch/1", timeout=None)),  # type: ignore[arg-type]
            (ValueError, lambda: aio.wait("nosuch/1", timeout=math.nan)),
            (TypeError, lambda: aio.call("noop", {}, timeout="3")),  # type: ignore[arg-type]
            (errors.InvalidArguments, lambda: aio.cancel("nosuch/1", by="x\ud800")),
            (errors.InvalidArguments, lambda: aio.approve("nosuch/1", by="two\nlines")),
            (errors.InvalidArguments, lambda: aio.cancel("nosuch/1", by="")),
        ]
        for exc, attempt in refusals:
            with pytest.raises(exc):
                await attempt()
        assert await aio.get("nosuch/1") is None
        assert await aio.get("bad ref") is None
        assert aio.watching() == 0

    run_aio(tq, body)
    # the ledger's meta records its format at the first connect: no operation's key
    assert set(tq.redis.keys("*")) - before == {tq.app.ledger.keys.meta.encode()}


def test_the_sync_client_refuses_the_same_bad_input_and_writes_nothing(tq: ToolQueue) -> None:
    before = set(tq.redis.keys("*"))
    refusals: list[tuple[type[Exception], Callable[[], Any]]] = [
        (errors.OperationNotFound, lambda: tq.wait(None)),  # type: ignore[arg-type]
        (errors.OperationNotFound, lambda: tq.cancel(None)),  # type: ignore[arg-type]
        (errors.OperationNotFound, lambda: tq.approve(5)),  # type: ignore[arg-type]
        (errors.OperationNotFound, lambda: tq.retry_now("bad ref\n")),
        (TypeError, lambda: tq.wait("nosuch/1", timeout=None)),  # type: ignore[arg-type]
        (ValueError, lambda: tq.wait("nosuch/1", timeout=math.nan)),
        (TypeError, lambda: tq.call("noop", {}, timeout="3")),  # type: ignore[arg-type]
        (errors.InvalidArguments, lambda: tq.cancel("nosuch/1", by="x\ud800")),
        (errors.InvalidArguments, lambda: tq.verify_now("nosuch/1", by="\x1b[31m")),
        (errors.InvalidArguments, lambda: tq.resolve("nosuch/1", "committed", reason="r", by=7)),  # type: ignore[arg-type]
    ]
    for exc, attempt in refusals:
        with pytest.raises(exc):
            attempt()
    assert tq.get(None) is None  # type: ignore[arg-type]
    assert tq.get("bad ref") is None
    assert set(tq.redis.keys("*")) - before <= {tq.app.ledger.keys.meta.encode()}


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [(30, 30.0), (0.5, 0.5), (0, 0.0), (-3, 0.0), (math.inf, math.inf), (10**400, math.inf)],
)
def test_a_wait_lasts_its_timeout_clamped_at_zero(timeout: float, seconds: float) -> None:
    assert operations.wait_seconds(timeout) == seconds


@pytest.mark.parametrize(
    ("timeout", "refusal"),
    [(None, TypeError), ("3", TypeError), (True, TypeError), (math.nan, ValueError)],
)
def test_a_timeout_that_is_not_a_number_of_seconds_is_refused(
    timeout: object, refusal: type[Exception]
) -> None:
    with pytest.raises(refusal, match="timeout must be a number of seconds"):
        operations.wait_seconds(timeout)


@pytest.mark.parametrize(
    ("by", "taken"),
    [
        ("operator:cancel", True),
        ("api:token-0123abcd", True),
        ("console:Ana María", True),
        ("", False),
        ("   ", False),
        ("two\nlines", False),
        ("x\ud800", False),
        ("a" * 201, False),
        (None, False),
    ],
)
def test_who_acts_is_one_line_of_printable_text(by: object, taken: bool) -> None:
    if taken:
        operator.check_actor(by)
    else:
        with pytest.raises(errors.InvalidArguments):
            operator.check_actor(by)


def test_a_ref_used_with_other_arguments_is_refused_by_the_async_submit(tq: ToolQueue) -> None:
    async def body() -> None:
        first = await tq.aio.submit("noop", {"n": 1}, operation_ref="k/1")
        again = await tq.aio.submit("noop", {"n": 1}, operation_ref="k/1")
        assert (first.created, again.created) == (True, False)
        with pytest.raises(errors.IdempotencyKeyReused):
            await tq.aio.submit("noop", {"n": 2}, operation_ref="k/1")

    run_aio(tq, body)


def test_operator_actions_are_awaited_the_same(tq: ToolQueue) -> None:
    async def body() -> None:
        ref = (await tq.aio.submit("guarded", {"n": 1})).operation_ref
        assert await tq.aio.approve(ref) is State.QUEUED
        with pytest.raises(errors.InvalidState):
            await tq.aio.approve(ref)
        assert await tq.aio.cancel(ref) is State.CANCELLED
        assert await tq.aio.cancel(ref) is State.CANCELLED  # already: said again, no write

    run_aio(tq, body)


def test_the_sync_call_reads_nothing_for_an_operation_it_created(
    tq: ToolQueue, reads: list[str]
) -> None:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(tq.call("noop", {"n": 7}, operation_ref="s/1")))
    t.start()
    assert wait_until(lambda: tq.get("s/1"), 10, 0.01)
    assert tq.runtime.run_attempt("s/1", 1) == "succeeded"
    t.join(10)
    assert got and got[0].ok and got[0].result == {"n": 7}
    assert reads == []


# ----------------------------------------------------------------------------- pure parts


def _seen(state: State = State.RUNNING, rev: int = 3) -> Seen:
    return Seen("r/1", state, rev, "noop", "")


ENV = (
    '{"ok":true,"operation_ref":"r/1","operation":"noop","commit_state":"committed",'
    '"result":{},"verification":{"checked_at":"2026-01-01T00:00:00Z"}}'
)


@pytest.mark.parametrize(
    ("state", "rev", "envelope", "then"),
    [
        (State.QUEUED, 2, "", "same"),  # older: published before the read
        (State.RUNNING, 3, "", "same"),  # the revision that was read
        (State.FAILED, 3, ENV, "read"),  # same revision, another state: contradicts the read
        (State.VERIFYING, 4, "", "moved"),  # newer, unsettled: taken, no read
        (State.SUCCEEDED, 4, ENV, "moved"),  # newer, settled, with its envelope: the outcome
        (State.AWAITING_APPROVAL, 4, "", "read"),  # settled without an envelope: read it
        (State.SUCCEEDED, 4, "{not json", "read"),
    ],
)
def test_what_a_waiter_does_with_a_notice(state: State, rev: int, envelope: str, then: str) -> None:
    seen = _seen()
    now = seen.heard(state, rev, envelope)
    if then == "same":
        assert now == seen
    elif then == "read":
        assert now is None
    else:
        assert now is not None and (now.state, now.rev) == (state, rev)
        assert (now.result() is not None) == (state is State.SUCCEEDED)


# ----------------------------------------------------------------------------- notices


@pytest.mark.parametrize(
    ("text", "event"),
    [
        ("running a/1\n2 2\n", Event("state", State.RUNNING, 2, None, "", 2, "a/1")),
        (
            'succeeded a/1\n3 3\n{"ok":true}',
            Event("state", State.SUCCEEDED, 3, None, '{"ok":true}', 3, "a/1"),
        ),
        ("succeeded a/1\n4\n", Event("state", State.SUCCEEDED, 4, None, "", 0, "a/1")),  # no seq
        ('progress a/1\n{"fraction":0.5}', Event("progress", progress=Progress(0.5), ref="a/1")),
        ("progress a/1\nnot json", None),
        ('progress a/1\n{"fraction":2}', None),
        ('progress a/1\n{"fraction":0.5,"message":7}', None),
        ("exploded a/1\n2 2\n", None),  # not a state
        ("running a/1\nx 2\n", None),
    ],
)
def test_a_notice_becomes_an_event_or_a_reason_to_read(text: str, event: Event | None) -> None:
    assert to_event(text) == event


def test_a_progress_message_travels_scrubbed_on_one_short_line() -> None:
    text = progress_notice("a/1", 0.5, "using sk-live-abcdefgh12345678\nthen " + "x" * 500)
    event = to_event(text)
    assert event is not None and event.progress is not None
    message = event.progress.message or ""
    assert "sk-live" not in message and "\n" not in message and len(message) <= 200


class _DeadServer:
    def __init__(self) -> None:
        self.tries = 0

    def spublish(self, channel: str, text: str) -> int:
        self.tries += 1
        raise redis.ConnectionError("connection refused")


def test_a_failed_progress_publish_never_fails_the_tool_and_pauses_a_while() -> None:
    now = [100.0]
    server = _DeadServer()
    publisher = ProgressPublisher(server, "chan", clock=lambda: now[0])  # type: ignore[arg-type]
    report = publisher.reporter("a/1")
    report(0.1, None)  # raises nothing
    now[0] += 1.0
    report(0.2, None)  # within the pause: not even tried
    assert server.tries == 1
    now[0] += PROGRESS_PAUSE_S
    report(1.0, "done")
    assert server.tries == 2


def test_the_async_ledger_writes_a_note_and_a_watcher_hears_a_quiet_one(tq: ToolQueue) -> None:
    note = {"check": "1", "result": "unavailable", "detail": "UPSTREAM_ERROR"}

    async def body() -> tuple[list[Event], list[Any]]:
        ref = (await tq.aio.submit("noop", {}, operation_ref="note/1")).operation_ref
        ledger = (await tq.aio._bound()).ledger
        seen: list[Event] = []
        async for ev in tq.aio.watch(ref):
            seen.append(ev)
            if len(seen) == 1:  # a quiet update with a note, through the async ledger
                t = Transition(
                    ref=ref, states=(State.QUEUED,), to=State.QUEUED, by="a", quiet=True, note=note
                )
                assert await ledger.apply([t], 1) == ["ok"]
            elif len(seen) == 2:
                cancel = Transition(ref=ref, states=(State.QUEUED,), to=State.CANCELLED, by="a")
                assert await ledger.apply([cancel], 2) == ["ok"]
        return seen, await tq.aio.history(ref)

    seen, history = run_aio(tq, body)
    assert [(e.kind, e.state, e.seq) for e in seen] == [
        ("state", State.QUEUED, 1),
        ("state", State.QUEUED, 2),  # the noted entry: from queued to queued
        ("state", State.CANCELLED, 3),
    ]
    assert [(h.from_, h.to, h.note) for h in history[1:]] == [
        (State.QUEUED, State.QUEUED, note),
        (State.QUEUED, State.CANCELLED, {}),
    ]
