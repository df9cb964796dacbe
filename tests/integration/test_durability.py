"""durability="fsync" on real servers: what is waited for, what is warned about.

A claim (queued -> running) and a submit are the two writes a power loss must
not undo (toolq.adapters.ledger.durability). On a server with ``appendfsync always``
each is followed by WAITAOF in the same round trip; on ``everysec`` and with
AOF off nothing waits and the process is warned once; a claim whose fsync is
not confirmed never calls its tool. The power loss itself is simulated by the
chaos harness (tests/e2e/test_chaos.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from tests.helpers import run_aio, serving, wait_until
from tests.integration.apps import runtime_app
from toolq import ToolQueue
from toolq.adapters.embedded import EmbeddedServer
from toolq.adapters.ledger import durability
from toolq.core import errors
from toolq.core.settings import ToolqSettings
from toolq.core.states import State

APP = "tests.integration.apps.runtime_app:tq"


class Args(BaseModel):
    n: int = 0


def _server(appendfsync: str) -> Iterator[str]:
    with EmbeddedServer(appendfsync=appendfsync) as server:
        yield str(server.url)


@pytest.fixture(scope="module")
def always() -> Iterator[str]:
    yield from _server("always")


@pytest.fixture(scope="module")
def everysec() -> Iterator[str]:
    yield from _server("everysec")


@pytest.fixture
def calls() -> list[str]:
    return []


def _queue(url: str, calls: list[str], mode: str = "fsync") -> ToolQueue:
    tq = ToolQueue(url, settings=ToolqSettings(durability=mode))  # type: ignore[arg-type]

    @tq.tool(writes=True)
    def write(args: Args, ctx: Any) -> dict[str, int]:
        calls.append(ctx.operation_ref)
        return {"n": args.n}

    tq.redis.flushdb()
    return tq


def _waitaofs(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0))
    finally:
        client.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "toolq.durability"]


def test_on_appendfsync_always_submit_and_claim_wait_for_the_fsync(
    always: str, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    tq = _queue(always, calls)
    try:
        # (a first call loads the scripts: its EVALSHAs answer NOSCRIPT and go again)
        first = tq.submit("write", {"n": 0}).operation_ref
        assert tq.runtime.run_attempt(first, 1) == "succeeded"
        before = _waitaofs(always)
        # When a call is submitted and its attempt claimed and run
        ref = tq.submit("write", {"n": 1}).operation_ref
        assert tq.runtime.run_attempt(ref, 1) == "succeeded"
    finally:
        tq.close()
    # Then each of the two writes was followed by one WAITAOF, and nothing was warned
    assert _waitaofs(always) - before == 2
    assert calls == [first, ref]
    assert _warnings(caplog) == []


def test_durability_none_never_waits(always: str, calls: list[str]) -> None:
    tq = _queue(always, calls, mode="none")
    before = _waitaofs(always)
    try:
        ref = tq.submit("write", {}).operation_ref
        assert tq.runtime.run_attempt(ref, 1) == "succeeded"
    finally:
        tq.close()
    assert _waitaofs(always) == before


def test_on_everysec_nothing_waits_and_the_process_is_warned_once(
    everysec: str, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    tq = _queue(everysec, calls)
    try:
        with caplog.at_level("WARNING", logger="toolq.durability"):
            refs = [tq.submit("write", {"n": n}).operation_ref for n in range(3)]
            assert [tq.runtime.run_attempt(ref, 1) for ref in refs] == ["succeeded"] * 3
    finally:
        tq.close()
    # WAITAOF there would cost ~100 ms a write and (Valkey 9.1) answer before the fsync
    assert _waitaofs(everysec) == 0
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert "appendfsync everysec" in warned[0] and "appendfsync always" in warned[0]


def test_with_aof_off_it_warns_and_still_runs(
    calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # A server without an AOF: WAITAOF would be an error there, and a restart loses all
    with EmbeddedServer(appendonly=False) as server:
        tq = _queue(str(server.url), calls)
        try:
            with caplog.at_level("WARNING", logger="toolq.durability"):
                ref = tq.submit("write", {}).operation_ref
                assert tq.runtime.run_attempt(ref, 1) == "succeeded"
        finally:
            tq.close()
        waited = _waitaofs(str(server.url))
    warned = _warnings(caplog)
    assert len(warned) == 1 and "appendonly no" in warned[0], warned
    assert waited == 0


def test_a_claim_not_confirmed_on_disk_never_calls_its_tool(
    calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a server that never fsyncs (appendfsync no) and does not say so (CONFIG
    # renamed away, as managed services do), so that WAITAOF is sent and times out
    # (after 50 ms here, 2 s by default)
    monkeypatch.setattr(durability, "WAITAOF", ("WAITAOF", 1, 0, 50))
    hidden = {"rename-command": 'CONFIG ""'}
    with EmbeddedServer(appendfsync="no", extra_config=hidden) as server:
        tq = _queue(str(server.url), calls)
        try:
            # When a submit is not confirmed, the caller is told it may submit again
            with pytest.raises(errors.NotDurable) as refused:
                tq.submit("write", {}, operation_ref="op-1")
            assert isinstance(refused.value, errors.ServerUnavailable)
            # (the server holds the operation: a resubmit returns it, it is not doubled)
            assert tq.get("op-1") is not None
            # When its attempt is claimed and the claim is not confirmed either
            outcome = tq.runtime.run_attempt("op-1", 1)
            rec = tq.get("op-1")
        finally:
            tq.close()
    # Then the tool was never called and the attempt went back to queued, unchanged
    assert outcome == "not_durable"
    assert calls == []
    assert rec is not None and rec.state is State.QUEUED and rec.attempt == 1
    assert [h.to for h in rec.history] == [State.QUEUED, State.RUNNING, State.QUEUED]


def test_a_real_worker_claims_durably(always: str) -> None:
    # The path every deployment runs: a worker process, the server toolq up starts
    before = _waitaofs(always)
    with serving(runtime_app.tq, APP, always) as tq:
        tq.redis.flushdb()
        refs = [tq.submit("pay", {"amount_cents": n}).operation_ref for n in (1, 2, 3)]
        envelopes = [tq.wait(ref, timeout=30) for ref in refs]
        done = wait_until(lambda: _waitaofs(always) - before >= 6, 10)
    assert all(env.ok for env in envelopes), envelopes
    # three submits here and three claims in the worker, each confirmed on disk
    assert done, _waitaofs(always) - before


def test_an_async_submit_waits_for_the_fsync_too(always: str, calls: list[str]) -> None:
    tq = _queue(always, calls)

    async def body() -> tuple[int, str]:
        # (the first loads the script and reads the server's settings)
        await tq.aio.submit("write", {"n": 0})
        before = _waitaofs(always)
        # When a call is submitted through tq.aio
        ref = (await tq.aio.submit("write", {"n": 1})).operation_ref
        return _waitaofs(always) - before, ref

    try:
        waited, ref = run_aio(tq, body)
        # Then it was followed by one WAITAOF, as a sync submit is, and it exists
        assert waited == 1
        assert tq.get(ref) is not None
    finally:
        tq.close()


def test_every_waited_call_writes_even_when_it_changes_nothing(always: str) -> None:
    # WAITAOF and WAIT count the writes of the connection they follow: a claim or submit
    # sent again (its reply lost), perhaps on a new connection, must write too, or its
    # waits answer at once and toolq acts on a first write nothing confirmed. The
    # server's count of changes (what it propagates to the AOF and replicas) shows it.
    from tests.contract.ops import LEASE, NOW, submit
    from toolq.adapters.ledger import Ledger

    client = redis.Redis.from_url(always)
    try:
        client.flushdb()
        ledger = Ledger(client, "tq", "none")

        def changes() -> int:
            return int(client.info("persistence")["rdb_changes_since_last_save"])

        submit(ledger, "again/1")
        assert ledger.claim("again/1", 1, "w1", NOW, LEASE).outcome == "claimed"
        before = changes()
        assert submit(ledger, "again/1").outcome == "exists"
        after_submit = changes()
        assert ledger.claim("again/1", 1, "w1", NOW + 5, LEASE).outcome == "claimed"
        assert after_submit > before and changes() > after_submit
    finally:
        client.close()
