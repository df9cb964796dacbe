"""``tq.aio`` against a real server and real worker processes.

- many concurrent calls on one event loop hold no thread per call (a ticker
  task reports how long the loop was ever blocked);
- a wait cancelled by its caller ends; the operation does not;
- progress a tool reports reaches ``on_progress`` and ``watch``;
- bad input is answered with toolq's typed errors, nothing written;
- a call under anyio, and from two loops in two threads at once;
- waits survive a restart of the server (a server of the test's own).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

import toolq.client.aio
from tests.helpers import run_aio, start_worker, stop_process, until_async
from tests.integration.apps import aio_app
from toolq import ToolQueue
from toolq.adapters.embedded import EmbeddedServer
from toolq.adapters.notify import Progress
from toolq.client.aio import WatchEvent
from toolq.core import errors
from toolq.core.envelope import ToolSuccess
from toolq.core.record import load_envelope
from toolq.core.states import State

APP = "tests.integration.apps.aio_app:tq"


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    q = aio_app.tq
    q.configure(redis_url=module_redis_url)
    worker = start_worker(APP, module_redis_url, pool="threads", concurrency=8)
    try:
        yield q
    finally:
        stop_process(worker, timeout=5)
        q.close()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A gate file: a gated tool runs until it exists."""
    return tmp_path / "gate"


class Ticker:
    """A task that sleeps 5 ms at a time and records how late it woke (the loop was
    blocked meanwhile) and the most threads the process had."""

    def __init__(self) -> None:
        self.max_late = 0.0
        self.max_threads = threading.active_count()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            self.max_late = max(self.max_late, loop.time() - before - 0.005)
            self.max_threads = max(self.max_threads, threading.active_count())


# ----------------------------------------------------------------------------- concurrency


def test_many_concurrent_calls_on_one_loop_hold_no_thread_per_call(
    tq: ToolQueue, record_property: Callable[[str, object], None]
) -> None:
    n = 200

    async def body() -> tuple[list[Any], Ticker, int]:
        await tq.aio.call("sleepy", {"seconds": 0.0}, timeout=30)  # connections made
        threads_before = threading.active_count()
        ticker = Ticker()
        tick = asyncio.create_task(ticker.run())
        calls = [tq.aio.call("sleepy", {"seconds": 0.02}, timeout=60) for _ in range(n)]
        envs = await asyncio.gather(*calls)
        tick.cancel()
        return envs, ticker, threads_before

    envs, ticker, threads_before = run_aio(tq, body)
    assert [e.ok for e in envs] == [True] * n
    assert len({e.operation_ref for e in envs}) == n
    # No thread per call (nor per wait): the process never had more threads than before.
    assert ticker.max_threads <= threads_before
    record_property("loop_max_block_ms", round(ticker.max_late * 1000, 1))
    print(f"\n{n} calls: loop blocked at most {ticker.max_late * 1000:.1f} ms")


def test_the_sync_call_submits_and_waits_in_one(tq: ToolQueue) -> None:
    env = tq.call("sleepy", {"seconds": 0.0}, operation_ref="sync-call/1", timeout=30)
    assert env.ok and env.result == {"slept": 0.0}
    again = tq.call("sleepy", {"seconds": 0.0}, operation_ref="sync-call/1", timeout=30)
    assert again == env  # the same operation, not a second one


# ----------------------------------------------------------------------------- cancellation


def test_a_wait_cancelled_by_its_caller_ends_and_the_operation_completes(
    tq: ToolQueue, gate: Path
) -> None:
    async def body() -> tuple[Any, Any]:
        # Given a call whose tool is running, and a second waiter on the same ref
        call = asyncio.create_task(tq.aio.call("gated", {"gate": str(gate)}, timeout=60))
        await until_async(lambda: tq.aio.watching() == 1)
        ref = next(iter(tq.aio._bound_to[asyncio.get_running_loop()].notifier.watched()))
        await until_async(lambda: (r := tq.get(ref)) is not None and r.state is State.RUNNING)
        other = asyncio.create_task(tq.aio.wait(ref, timeout=60))
        await until_async(lambda: tq.aio.watching() == 2)
        # When both callers cancel their waits
        call.cancel()
        other.cancel()
        for task in (call, other):
            with pytest.raises(asyncio.CancelledError):
                await task
        # Then nothing waits any more, and the operation goes on
        assert tq.aio.watching() == 0
        assert tq.get(ref).state is State.RUNNING  # type: ignore[union-attr]
        gate.touch()
        return ref, await tq.aio.wait(ref, timeout=60)

    ref, env = run_aio(tq, body)
    assert env.ok and env.result == {"ref": ref}
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.SUCCEEDED and rec.attempt == 1


def test_many_waits_cancelled_at_once_all_end_whatever_they_were_doing(
    tq: ToolQueue, gate: Path
) -> None:
    async def body() -> None:
        refs = [
            (await tq.aio.submit("gated", {"gate": str(gate)})).operation_ref for _ in range(300)
        ]
        # Cancelled at different points: waiting for a turn, for a connection, in the
        # first read, subscribed. (Python 3.11's wait_for, under redis-py's sends, once
        # swallowed such cancellations: waits went on.)
        for pause in (0.0, 0.002, 0.005, 0.01, 0.05):
            waits = [asyncio.create_task(tq.aio.wait(r, timeout=60)) for r in refs]
            await asyncio.sleep(pause)
            for w in waits:
                w.cancel()
            _, pending = await asyncio.wait(waits, timeout=30)
            assert not pending, f"{len(pending)} waits went on after being cancelled"
            assert tq.aio.watching() == 0
        gate.touch()  # the operations were never touched by any of it
        envs = await asyncio.gather(*(tq.aio.wait(r, timeout=60) for r in refs))
        assert all(e.ok for e in envs)

    run_aio(tq, body)


# ----------------------------------------------------------------------------- progress


def test_progress_reaches_on_progress(tq: ToolQueue, gate: Path) -> None:
    heard: list[Progress] = []

    async def on_progress(p: Progress) -> None:
        heard.append(p)

    gate.touch()
    steps = [0.25, 0.5, 0.75, 1.0]
    env = run_aio(
        tq,
        lambda: tq.aio.call(
            "gated", {"gate": str(gate), "steps": steps}, timeout=60, on_progress=on_progress
        ),
    )
    assert env.ok
    assert heard == [Progress(f, f"step {i + 1}") for i, f in enumerate(steps)]


def test_watch_follows_states_and_progress_to_the_settled_state(tq: ToolQueue, gate: Path) -> None:
    async def body() -> tuple[str, list[WatchEvent], list[Any]]:
        args = {"gate": str(gate), "steps": [0.5, 1.0]}
        ref = (await tq.aio.submit("gated", args)).operation_ref
        events: list[WatchEvent] = []
        async for ev in tq.aio.watch(ref):
            events.append(ev)
            if ev.state is State.RUNNING:
                gate.touch()  # let the tool go on only once its start was seen
        assert tq.aio.watching() == 0
        return ref, events, await tq.aio.history(ref)

    ref, events, history = run_aio(tq, body)
    states = [e for e in events if e.kind == "state"]
    progress = [e.progress for e in events if e.kind == "progress"]
    assert [e.state for e in states][-2:] == [State.RUNNING, State.SUCCEEDED]
    assert [e.rev for e in states] == sorted({e.rev for e in states})  # each once, in order
    for e in states:  # seq names the history entry of the state entered
        assert history[e.seq - 1].to == e.state
    assert progress == [Progress(0.5, "step 1"), Progress(1.0, "step 2")]
    # The settled state's envelope is the model (it was the JSON string before)
    last = events[-1]
    assert last.kind == "state" and isinstance(last.envelope, ToolSuccess), last
    assert last.envelope.ok and last.envelope.operation_ref == ref
    assert load_envelope(last.envelope_json) == last.envelope  # the stored JSON, kept
    assert load_envelope(last.envelope) is last.envelope  # code that parsed it still works
    # A state that wrote no envelope says None, not ""
    assert all(e.envelope is None for e in states if e.state is State.QUEUED)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_answered_with_typed_errors_and_nothing_written(tq: ToolQueue) -> None:
    ledger_keys = f"{tq.ledger.keys.tag}:*"
    before = set(tq.redis.scan_iter(ledger_keys))

    async def body() -> None:
        aio = tq.aio
        refusals: list[tuple[type[Exception], Callable[[], Awaitable[Any]]]] = [
            (errors.UnknownTool, lambda: aio.call("nosuch", {})),
            (errors.InvalidArguments, lambda: aio.call("sleepy", {"seconds": "x"})),
            (errors.InvalidArguments, lambda: aio.call("sleepy", {}, operation_ref="no spaces")),
            (errors.InvalidArguments, lambda: aio.submit("sleepy", {}, operation_ref="a" * 201)),
            (errors.OperationNotFound, lambda: aio.wait("never/submitted", timeout=5)),
            (errors.OperationNotFound, lambda: aio.wait("no spaces", timeout=5)),
            (errors.OperationNotFound, lambda: aio.history("never/submitted")),
            (errors.OperationNotFound, lambda: aio.cancel("never/submitted")),
            (errors.OperationNotFound, lambda: anext(aio.watch("never/submitted"))),
        ]
        for exc, attempt in refusals:
            with pytest.raises(exc):
                await attempt()
        assert await aio.get("never/submitted") is None
        assert aio.watching() == 0

    run_aio(tq, body)
    assert set(tq.redis.scan_iter(ledger_keys)) == before


# ----------------------------------------------------------------------------- loops


def test_a_call_under_anyio_and_from_two_loops_in_two_threads(tq: ToolQueue) -> None:
    async def one(ref: str) -> Any:
        try:
            return await tq.aio.call("sleepy", {"seconds": 0.05}, operation_ref=ref, timeout=30)
        finally:
            await tq.aio.aclose()

    env = anyio.run(one, "anyio/1", backend="asyncio")
    assert env.ok

    got: dict[str, Any] = {}

    def in_thread(ref: str) -> None:
        got[ref] = asyncio.run(one(ref))

    threads = [threading.Thread(target=in_thread, args=(f"loops/{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == ["loops/0", "loops/1"] and all(e.ok for e in got.values())
    assert tq.aio._bound_to == {}  # each loop's connections closed with it


def test_connections_of_a_loop_that_ended_without_aclose_are_closed(tq: ToolQueue) -> None:
    async def forgetful() -> Any:
        return await tq.aio.call("sleepy", {"seconds": 0.0}, timeout=30)

    assert asyncio.run(forgetful()).ok  # asyncio.run cancels the loop's tasks at its end
    assert tq.aio._bound_to == {}


# ----------------------------------------------------------------------------- a restart


def test_waits_survive_a_restart_of_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No fallback read: only notices and the read again when the subscription comes back
    # can end these waits (a wait that missed both sleeps past pytest's timeout). Calls
    # settled while the server restarted were found only by the fallback read, 12 s on:
    # the read again failed on a connection of the loop's pool the server had closed.
    monkeypatch.setattr(toolq.client.aio, "FALLBACK_READ_S", 3600.0)
    # A server of this test's own, durable, so that the restart keeps the ledger.
    with EmbeddedServer(tmp_path / "data", extra_config={"appendfsync": "always"}) as server:
        q = aio_app.make()
        q.configure(redis_url=server.url)
        worker = start_worker(APP, server.url, pool="threads", concurrency=4)
        gate = tmp_path / "gate"
        try:

            async def body() -> list[Any]:
                # Given 8 waits on running or queued operations (their tools hold at the gate)
                refs = [
                    (await q.aio.submit("gated", {"gate": str(gate)})).operation_ref
                    for _ in range(8)
                ]
                waits = [asyncio.create_task(q.aio.wait(r, timeout=3600)) for r in refs]
                await until_async(lambda: q.aio.watching() == len(refs))
                running = lambda: sum(q.get(r).state is State.RUNNING for r in refs)  # type: ignore[union-attr] # noqa: E731
                await until_async(lambda: running() == 4)
                notifier = q.aio._bound_to[asyncio.get_running_loop()].notifier
                assert notifier.subscriptions == 1
                # When the server restarts under them, and only then the tools finish
                await asyncio.to_thread(server.restart)
                assert not any(w.done() for w in waits)
                gate.touch()
                # Then every wait ends with its outcome, after re-subscribing once
                envs = await asyncio.gather(*waits)
                assert notifier.subscriptions >= 2
                return envs

            envs = run_aio(q, body)
        finally:
            stop_process(worker, timeout=5)
            q.close()
    assert [e.ok for e in envs] == [True] * 8


def test_reads_and_submits_after_a_restart_of_the_server_answer_at_once(tmp_path: Path) -> None:
    # Given a loop whose pool holds connections to the server, which then restarts
    with EmbeddedServer(tmp_path / "data", extra_config={"appendfsync": "always"}) as server:
        q = aio_app.make()
        q.configure(redis_url=server.url)

        async def body() -> list[State]:
            refs = [(await q.aio.submit("sleepy", {})).operation_ref for _ in range(4)]
            # several reads at once: several connections in the loop's pool
            await asyncio.gather(*(q.aio.get(r) for r in refs))
            await asyncio.to_thread(server.restart)
            # When the program reads again, the server up: every read answers (the
            # first on each connection the restart closed was QUEUE_UNAVAILABLE)
            got = await asyncio.gather(*(q.aio.get(r) for r in refs))
            # And after another restart, every submit is taken (scripts are not sent
            # again: the connections the restart closed are opened again first)
            await asyncio.to_thread(server.restart)
            more = await asyncio.gather(*(q.aio.submit("sleepy", {}) for _ in refs))
            assert len({m.operation_ref for m in more}) == len(refs)
            return [g.state for g in got]

        try:
            states = run_aio(q, body)
        finally:
            q.close()
    # Then from the ledger the restart kept
    assert states == [State.QUEUED] * 4


def test_an_unreachable_server_is_server_unavailable_not_a_hang() -> None:
    q = aio_app.make()
    with EmbeddedServer(appendonly=False) as server:
        url = server.url
    q.configure(redis_url=url)  # nothing listens there any more

    async def body() -> None:
        with pytest.raises(errors.ServerUnavailable) as refused:
            await q.aio.submit("sleepy", {})
        assert isinstance(refused.value.__cause__, redis.ConnectionError)
        with pytest.raises(errors.ServerUnavailable):
            await q.aio.wait("some/ref", timeout=1)
        with pytest.raises(errors.ServerUnavailable):
            await anext(q.aio.watch("some/ref"))
        assert q.aio.watching() == 0

    run_aio(q, body)  # returns: pytest's timeout would fail a hang
    q.close()


_FREEZE_PROBE = """
import asyncio, gc, sys
from toolq import ToolQueue
q = ToolQueue()
q.configure(redis_url=sys.argv[1])
before = gc.get_freeze_count()
async def main():
    await q.aio.ping()
    await q.aio.aclose()
asyncio.run(main())
print(before, gc.get_freeze_count())
"""


@pytest.mark.parametrize("setting", ["", "false"])
def test_the_first_use_of_aio_freezes_the_heap_unless_told_not_to(
    redis_url: str, setting: str
) -> None:
    # Given a fresh process (the freeze is once per process, for the whole heap)
    env = {k: v for k, v in os.environ.items() if k != "TOOLQ_CLIENT__FREEZE_HEAP"}
    if setting:
        env["TOOLQ_CLIENT__FREEZE_HEAP"] = setting
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE, redis_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    before, after = int(out[0]), int(out[1])
    # Then the import-time heap is frozen by default: a full collection no longer walks it
    assert before == 0
    if setting:
        assert after == 0
    else:
        assert after > 10_000
