"""``tq.aio`` with its ledger on a real Valkey Cluster (issue 18).

The ledger in 16 cells over three primaries (``TOOLQ_CLUSTER=1``), Celery's broker
a plain Valkey (outbox mode), real worker, scheduler and relay processes; the test
process calls through ``tq.aio`` (``AsyncLedgerCluster``). Calls in every cell
complete once each with no ``COMMAND GETKEYS``, notices from every primary wake
its waiters, bad input is refused with typed errors, and a primary SIGKILLed
mid-run (the one holding the notice subscription) loses and doubles nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from redis.cluster import key_slot

from tests.cluster import Cluster
from tests.helpers import run_aio
from tests.integration.apps import cells_app
from tests.integration.cluster.conftest import CELLS, committed
from toolq import ToolQueue
from toolq.adapters.ledger.cluster import AsyncLedgerCluster
from toolq.client.aio import CONNECTIONS_PER_LOOP, _Bound
from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.keys import Keys
from toolq.core.states import State
from toolq.edges import monitor

APP = cells_app.APP


@pytest.fixture(scope="module")
def tq(deployed: ToolQueue) -> ToolQueue:
    return deployed


def _commands(cluster: Cluster, name: str) -> int:
    """How many times the live nodes ran command ``name`` (``command|getkeys``...)."""
    stats = [node.client().info("commandstats") for node in cluster.live()]
    return sum(int(s.get(f"cmdstat_{name}", {}).get("calls", 0)) for s in stats)


def _bound(tq: ToolQueue) -> _Bound:
    return tq.aio._bound_to[asyncio.get_running_loop()]


def _owner(cluster: Cluster, cell: int) -> int:
    return cluster.owner(key_slot(Keys("toolq", cell).tag.encode())).port


def test_calls_in_every_cell_through_tq_aio_complete_once_each(
    tq: ToolQueue, provider: redis.Redis, cluster: Cluster
) -> None:
    refs = [f"aio/ok/{i}" for i in range(48)]
    assert {cell_of(ref, CELLS) for ref in refs} == set(range(CELLS))
    getkeys = _commands(cluster, "command|getkeys")

    async def body() -> tuple[list[Any], list[Any], dict[str, Any], list[str]]:
        # many cells at once, on every primary
        called = await asyncio.gather(
            *(tq.aio.call("pay", {}, operation_ref=ref, timeout=30) for ref in refs[:40])
        )
        # submit, then wait, then get
        for ref in refs[40:]:
            sub = await tq.aio.submit("pay", {}, operation_ref=ref)
            assert sub.created and sub.state is State.QUEUED
        waited = [await tq.aio.wait(ref, timeout=30) for ref in refs[40:]]
        records = [await tq.aio.get(ref) for ref in refs]
        assert all(r is not None and r.state is State.SUCCEEDED for r in records)
        # the same ref again is the same operation, in its own cell
        again = await tq.aio.submit("pay", {}, operation_ref=refs[0])
        assert not again.created and again.state is State.SUCCEEDED
        assert isinstance(await tq.aio.client(), AsyncLedgerCluster)
        # the console's read-only views merge every cell's reads
        overview = await monitor.overview(tq.aio)
        assert isinstance(await monitor.series(tq.aio, 1.0), list)
        page = await tq.aio.list_operations("succeeded", ref_contains="aio/ok/", limit=100)
        return called, waited, overview, [s.operation_ref for s in page.items]

    called, waited, overview, listed = run_aio(tq, body)
    assert all(isinstance(e, ToolSuccess) for e in called + waited)
    assert [e.result["paid"] for e in called + waited] == refs
    effects = committed(provider)
    assert [r for r in refs if effects[r] != 1] == []
    assert overview["totals"]["states"]["succeeded"] >= len(refs)
    assert sorted(listed) == sorted(refs)
    # every FCALL found its node from its keys: no COMMAND GETKEYS (worker,
    # scheduler and relay read theirs the same way)
    assert _commands(cluster, "command|getkeys") == getkeys
    # the records are on the primaries of their cells, all three of them
    assert len({_owner(cluster, cell_of(r, CELLS)) for r in refs}) == 3


def test_notices_from_every_primary_wake_the_loops_waiters(tq: ToolQueue, cluster: Cluster) -> None:
    # a ref in a cell of each primary: its notices reach the loop's one subscription
    refs: dict[int, str] = {}
    for i in range(400):
        ref = f"aio/notice/{i}"
        refs.setdefault(_owner(cluster, cell_of(ref, CELLS)), ref)
    assert len(refs) == 3

    async def body() -> list[bool]:
        await tq.aio.ping()
        notifier = _bound(tq).notifier
        heard = []
        for ref in refs.values():
            w = await notifier.watch(ref, progress=True)
            try:
                await tq.aio.submit("pay", {}, operation_ref=ref)
                # True only when a notice arrived (nothing else puts an event)
                heard.append(await w.wait(20.0))
                events, _ = w.take()
                assert events and events[0].ref == ref
            finally:
                notifier.unwatch(ref, w)
        assert notifier.subscriptions == CELLS  # one confirmation per cell's channel
        return heard

    assert run_aio(tq, body) == [True, True, True]


def test_bad_input_is_answered_with_typed_errors_and_nothing_written(
    tq: ToolQueue, cluster: Cluster
) -> None:
    def keys() -> int:
        # the operations' records (the processes' beats and leases come and go)
        return sum(len(node.client().keys("*:op:*")) for node in cluster.primaries())

    before = keys()

    async def body() -> None:
        aio = tq.aio
        refusals: list[tuple[type[Exception], Callable[[], Awaitable[Any]]]] = [
            (errors.UnknownTool, lambda: aio.call("nosuch", {})),
            (errors.InvalidArguments, lambda: aio.call("pay", {"mode": ["x"]})),
            (errors.InvalidArguments, lambda: aio.call("pay", "not an object")),
            (errors.InvalidArguments, lambda: aio.call("pay", {}, operation_ref="no spaces")),
            (errors.OperationNotFound, lambda: aio.wait("aio/never", timeout=5)),
            (errors.OperationNotFound, lambda: aio.history("aio/never")),
            (errors.OperationNotFound, lambda: aio.cancel("aio/never")),
        ]
        for exc, attempt in refusals:
            with pytest.raises(exc):
                await attempt()
        assert await aio.get("aio/never") is None
        assert aio.watching() == 0

    run_aio(tq, body)
    assert keys() == before


def test_more_reads_at_once_than_a_node_has_connections(tq: ToolQueue) -> None:
    # A Cluster node raises MaxConnectionsError when out of connections (redis.asyncio
    # does not wait for one): the ledger's commands wait for their turn instead.
    n = CONNECTIONS_PER_LOOP * 10

    async def body() -> list[Any]:
        return await asyncio.gather(*(tq.aio.get(f"aio/absent/{i}") for i in range(n)))

    assert run_aio(tq, body) == [None] * n


def test_lists_and_views_at_once_beside_the_ledger_wait_for_a_connection(tq: ToolQueue) -> None:
    # Lists (a pipeline and a script per cell) and tq.aio.client() views use the same
    # nodes' connections as the ledger: they wait for their turn too, not fail.
    n = CONNECTIONS_PER_LOOP * 4

    async def body() -> list[Any]:
        client = await tq.aio.client()
        return await asyncio.gather(
            *(tq.aio.get(f"aio/absent/{i}") for i in range(n)),
            *(tq.aio.list_operations("queued", tool="aio-absent") for _ in range(n)),
            *(client.exists(Keys("toolq", i % CELLS).op(f"aio/absent/{i}")) for i in range(n)),
        )

    got = run_aio(tq, body)
    assert got[:n] == [None] * n
    assert [page.items for page in got[n : 2 * n]] == [[]] * n
    assert got[2 * n :] == [0] * n


def test_a_primary_killed_mid_run_loses_and_doubles_nothing_through_tq_aio(
    tq: ToolQueue, provider: redis.Redis, cluster: Cluster
) -> None:
    refs = [f"aio/kill/{i}" for i in range(60)]
    retried = [f"aio/kill-rl/{i}" for i in range(6)]
    # the primary the loop's notice subscription is on: the first cell's channel's
    channel = Keys("toolq", 0).notify
    slot = key_slot(channel.encode())
    assert cluster.owner(slot) is not cluster.nodes[0]  # the processes' URL stays up
    unavailable = 0

    async def agent(ref: str, mode: str) -> ToolSuccess | ToolError:
        """What an agent does when the server is away: the same call again (same ref)."""
        nonlocal unavailable
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                return await tq.aio.call("pay", {"mode": mode}, operation_ref=ref, timeout=60)
            except errors.ServerUnavailable:
                unavailable += 1
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def body() -> tuple[list[ToolSuccess | ToolError], int]:
        await tq.aio.ping()
        notifier = _bound(tq).notifier
        calls = [asyncio.create_task(agent(ref, "rate_limited")) for ref in retried]
        kill: asyncio.Task[tuple[Any, float]] | None = None
        during = 0  # calls begun while the primary was dead or being replaced
        for ref in refs:
            calls.append(asyncio.create_task(agent(ref, "ok")))
            if ref == refs[10]:  # mid-run: some done, some running, more to come
                kill = asyncio.create_task(asyncio.to_thread(cluster.kill_primary, slot))
            elif kill is not None and not kill.done():
                during += 1
            await asyncio.sleep(0.05)
        assert kill is not None
        killed.append((await kill)[0])
        envs = await asyncio.gather(*calls)
        # the subscription came back on the new primary, and hears notices again
        assert notifier.subscriptions > CELLS
        w = await notifier.watch("aio/kill/after", progress=True)
        try:
            await tq.aio.submit("pay", {}, operation_ref="aio/kill/after")
            assert await w.wait(20.0)
        finally:
            notifier.unwatch("aio/kill/after", w)
        return envs, during

    killed: list[Any] = []
    try:
        envs, during = run_aio(tq, body)
        assert during > 0  # a failover takes at least the node timeout (1 s)
        assert [e.ok for e in envs] == [True] * len(retried + refs)
        effects = committed(provider)
        assert [r for r in refs + retried if effects[r] > 1] == []  # doubled
        assert [r for r in refs + retried if effects[r] == 0] == []  # lost
        for ref in refs + retried:
            record = tq.get(ref)
            assert record is not None and record.state == "succeeded"
        print(f"{during} calls begun during the failover; ServerUnavailable {unavailable} times")
    finally:
        for victim in killed:
            cluster.revive(victim)
