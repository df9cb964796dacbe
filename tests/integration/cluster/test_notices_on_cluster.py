"""Notices on a real Valkey Cluster: sharded Pub/Sub per cell (issue 18).

The scripts SPUBLISH each notice to its cell's channel, in the cell's slot, so it
stays on the primary that ran the script; no classic PUBLISH crosses the cluster
bus. A waiter's subscription (sync :class:`Notifier`, :class:`AsyncNotifier` on
``redis.asyncio``'s RedisCluster) holds one connection per primary and hears calls
settle in cells on every node; a slot migrated or a primary killed while a waiter
waits: the channel is subscribed again on the new owner, every waiter is told to
read again, and the call's notice is heard there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster, key_slot

from tests.cluster import HOST, Cluster, Node, wait_for
from tests.contract.ops import LEASE, NOW, TOOL, submit
from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.cluster import LedgerCluster
from toolq.adapters.notify import (
    AsyncNotifier,
    AsyncShardedSubscription,
    Notifier,
    ProgressPublisher,
    ShardedSubscription,
    Waiter,
    Wake,
)
from toolq.core.cells import DEFAULT_CELLS, cell_of
from toolq.core.keys import Keys
from toolq.core.own_envelopes import success_envelope
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition

S = State
CHANNELS = [Keys("toolq", c).notify for c in range(DEFAULT_CELLS)]
STEPS = [Keys("toolq", c).notify_steps for c in range(DEFAULT_CELLS)]


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[RedisCluster]:
    rc = LedgerCluster(startup_nodes=cluster.startup_nodes)
    try:
        yield rc
    finally:
        rc.close()


@pytest.fixture
def ledger(client: RedisCluster) -> Iterator[Ledger]:
    client.flushall()
    yield Ledger(client, "toolq", outbox=True)  # type: ignore[arg-type]


@pytest.fixture
def notifier(client: RedisCluster) -> Iterator[Notifier]:
    n = Notifier(client, *CHANNELS, subscription=ShardedSubscription)  # type: ignore[arg-type]
    yield n
    n.close()


def _slot(ref: str) -> int:
    return key_slot(Keys("toolq", cell_of(ref, DEFAULT_CELLS)).tag.encode())


def _ref_on(cluster: Cluster, node: Node, name: str) -> str:
    """A ref whose cell lives on ``node``."""
    return next(f"{name}/{i}" for i in range(10_000) if cluster.owner(_slot(f"{name}/{i}")) is node)


def _settle(ledger: Ledger, ref: str) -> None:
    cell = ledger.in_cell(cell_of(ref, DEFAULT_CELLS))
    assert submit(cell, ref).outcome == "created"
    assert cell.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
    env = success_envelope(ref, TOOL, "call-1", {"n": 1}, datetime.fromtimestamp(NOW / 1000, UTC))
    done = Transition(ref=ref, states=(S.RUNNING,), to=S.SUCCEEDED, by="w1", envelope=env)
    assert cell.apply([done], NOW + 1) == ["ok"]


def _subscribers(node: Node, channel: str) -> int:
    """How many connections of ``node`` are subscribed to the sharded ``channel``."""
    reply = node.call("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


def _publishes(cluster: Cluster, kind: str) -> list[int]:
    """Calls of ``publish`` or ``spublish`` each primary ran (scripts' included)."""
    stats = [node.client().info("commandstats") for node in cluster.primaries()]
    return [int(s.get(f"cmdstat_{kind}", {}).get("calls", 0)) for s in stats]


def _heard_settled(ev: Wake, timeout: float = 10.0) -> bool:
    """Whether ``ev`` hears the succeeded notice (what reads again come before it)."""
    waited = 0.0
    while waited < timeout:
        if not ev.wait(1.0):
            waited += 1.0
            continue
        notice, _ = ev.take()
        if notice is not None and notice.state is S.SUCCEEDED:
            return True
    return False


def test_a_waiter_hears_calls_settle_on_every_node_and_nothing_is_broadcast(
    cluster: Cluster, ledger: Ledger, notifier: Notifier
) -> None:
    for node in cluster.primaries():
        node.call("CONFIG", "RESETSTAT")
    for node in cluster.primaries():
        ref = _ref_on(cluster, node, f"every-{node.port}")
        ev = notifier.watch(ref)
        _settle(ledger, ref)
        assert _heard_settled(ev), ref  # from the notice itself: no read needed
        notifier.unwatch(ref, ev)
        # subscribed on the cell's node only (PUBSUB answers for the node asked)
        channel = Keys("toolq", cell_of(ref, DEFAULT_CELLS)).notify
        assert [_subscribers(n, channel) for n in cluster.primaries()] == [
            int(n is node) for n in cluster.primaries()
        ]
    # each primary SPUBLISHed its own cell's notices (queued, running, succeeded):
    # no classic PUBLISH, which the cluster bus would carry to every node
    assert _publishes(cluster, "publish") == [0, 0, 0]
    assert _publishes(cluster, "spublish") == [3, 3, 3]


def test_a_slot_migrated_while_a_waiter_waits(
    cluster: Cluster, ledger: Ledger, notifier: Notifier
) -> None:
    source = cluster.primaries()[0]
    target = cluster.primaries()[1]
    ref = _ref_on(cluster, source, "moved")
    channel = Keys("toolq", cell_of(ref, DEFAULT_CELLS)).notify
    ev = notifier.watch(ref)
    assert _subscribers(source, channel) == 1
    cluster.migrate_slot(_slot(ref), target)
    # The source told the subscriber (sunsubscribe); it subscribed on the new owner
    # and woke every waiter to read again (what was published meanwhile is gone).
    wait_for("the channel subscribed on its new owner", lambda: _subscribers(target, channel) == 1)
    assert _subscribers(source, channel) == 0
    assert ev.wait(10)
    assert ev.take() == (None, True)
    _settle(ledger, ref)
    assert _heard_settled(ev)


def test_a_primary_killed_while_a_waiter_waits(
    cluster: Cluster, ledger: Ledger, notifier: Notifier
) -> None:
    victim = cluster.primaries()[2]
    ref = _ref_on(cluster, victim, "killed")
    other = _ref_on(cluster, cluster.primaries()[0], "alive")
    channel = Keys("toolq", cell_of(ref, DEFAULT_CELLS)).notify
    ev, ev_other = notifier.watch(ref), notifier.watch(other)
    cluster.kill_primary(_slot(ref))
    try:
        heir = cluster.owner(_slot(ref))
        wait_for(
            "the channel subscribed on the promoted replica",
            lambda: _subscribers(heir, channel) == 1,
        )
        assert ev.wait(10)
        assert ev.take()[1]  # read again: notices of the failover's seconds are gone
        _settle(ledger, ref)
        assert _heard_settled(ev)
        _settle(ledger, other)  # the other nodes' subscriptions were never lost
        assert _heard_settled(ev_other)
    finally:
        cluster.revive(victim)


def test_the_async_notifier_on_redis_asyncio_cluster(cluster: Cluster, ledger: Ledger) -> None:
    refs = [_ref_on(cluster, node, f"aio-{node.port}") for node in cluster.primaries()]
    progress = ProgressPublisher(
        ledger.redis, lambda ref: Keys("toolq", cell_of(ref, DEFAULT_CELLS)).notify_steps
    )

    async def body() -> list[list[str]]:
        client = AsyncRedisCluster(host=HOST, port=cluster.primaries()[0].port)
        notifier = AsyncNotifier(client, CHANNELS, STEPS, subscription=AsyncShardedSubscription)
        try:
            waiters = [await notifier.watch(ref, progress=True) for ref in refs]
            heard: list[list[str]] = []
            for ref, w in zip(refs, waiters, strict=True):
                await asyncio.to_thread(_settle, ledger, ref)
                assert progress.publish(ref, 0.5, "half")
                seen: list[str] = []
                while len(seen) < 4:
                    assert await w.wait(10)
                    events, reread = w.take()
                    assert not reread
                    seen += [e.kind if e.state is None else str(e.state) for e in events]
                heard.append(seen)
            return heard
        finally:
            await notifier.aclose()
            await client.aclose()

    heard = asyncio.run(body())
    assert heard == [["queued", "running", "succeeded", "progress"]] * 3


def test_the_async_notifier_follows_a_migrated_slot_and_a_failover(
    cluster: Cluster, ledger: Ledger
) -> None:
    moved = _ref_on(cluster, cluster.primaries()[0], "aio-moved")
    killed = _ref_on(cluster, cluster.primaries()[1], "aio-killed")
    target = cluster.primaries()[2]

    async def reread_then_settled(w: Waiter, ref: str, channel: str) -> list[str]:
        assert await w.wait(10)
        assert w.take() == ([], True)  # subscribed again: read the record
        node = cluster.owner(_slot(ref))
        await asyncio.to_thread(
            wait_for, "subscribed on the new owner", lambda: _subscribers(node, channel) == 1
        )
        await asyncio.to_thread(_settle, ledger, ref)
        seen: list[str] = []
        while "succeeded" not in seen:
            assert await w.wait(10)
            seen += [str(e.state) for e in w.take()[0]]
        return seen

    async def body() -> None:
        client = AsyncRedisCluster(host=HOST, port=target.port)
        notifier = AsyncNotifier(client, CHANNELS, STEPS, subscription=AsyncShardedSubscription)
        try:
            w = await notifier.watch(moved)
            await asyncio.to_thread(cluster.migrate_slot, _slot(moved), target)
            channel = Keys("toolq", cell_of(moved, DEFAULT_CELLS)).notify
            assert await reread_then_settled(w, moved, channel) == ["succeeded"]
            w = await notifier.watch(killed)
            victim, _ = await asyncio.to_thread(cluster.kill_primary, _slot(killed))
            try:
                channel = Keys("toolq", cell_of(killed, DEFAULT_CELLS)).notify
                assert await reread_then_settled(w, killed, channel) == ["succeeded"]
            finally:
                await asyncio.to_thread(cluster.revive, victim)
        finally:
            await notifier.aclose()
            await client.aclose()

    asyncio.run(body())


def _until_subscribed(get: Any) -> list[str]:
    """The kinds of message heard up to the next subscription confirmed."""
    kinds: list[str] = []
    for _ in range(100):
        msg = get()
        if msg is not None:
            kinds.append(msg["type"])
            if msg["type"] == "subscribe":
                return kinds
    raise AssertionError(f"no subscription confirmed: {kinds}")


def test_a_node_whose_last_channel_moved_away_is_let_go(
    cluster: Cluster, client: RedisCluster
) -> None:
    source, target = cluster.primaries()[0], cluster.primaries()[1]
    slot = _slot(_ref_on(cluster, source, "last"))
    channel = next(c for c in CHANNELS if key_slot(c.encode()) == slot)
    sub = ShardedSubscription(client, [channel])  # type: ignore[arg-type]
    try:
        assert _until_subscribed(lambda: sub.get_message(0.1)) == ["subscribe"]
        assert sub.nodes() == {f"{HOST}:{source.port}"}
        cluster.migrate_slot(slot, target)
        assert _until_subscribed(lambda: sub.get_message(0.1)) == ["unsubscribe", "subscribe"]
        # The source serves none of its channels now: its connection is closed
        assert sub.nodes() == {f"{HOST}:{target.port}"}
        assert _subscribers(target, channel) == 1
    finally:
        sub.close()


def test_the_async_subscription_lets_go_of_a_node_and_its_reader(cluster: Cluster) -> None:
    source, target = cluster.primaries()[1], cluster.primaries()[2]
    slot = _slot(_ref_on(cluster, source, "aio-last"))
    channel = next(c for c in CHANNELS if key_slot(c.encode()) == slot)

    async def until_subscribed(sub: AsyncShardedSubscription) -> list[str]:
        kinds: list[str] = []
        for _ in range(100):
            msg = await sub.get_message(0.1)
            if msg is not None:
                kinds.append(msg["type"])
                if msg["type"] == "subscribe":
                    return kinds
        raise AssertionError(f"no subscription confirmed: {kinds}")

    async def body() -> None:
        client = AsyncRedisCluster(host=HOST, port=target.port)
        sub = AsyncShardedSubscription(client, [channel])
        try:
            assert await until_subscribed(sub) == ["subscribe"]
            assert sub.nodes() == {f"{HOST}:{source.port}"}
            readers = [t for t in asyncio.all_tasks() if t.get_name().startswith("toolq-notices")]
            await asyncio.to_thread(cluster.migrate_slot, slot, target)
            assert await until_subscribed(sub) == ["unsubscribe", "subscribe"]
            # The source's connection is closed, and the task that read it has ended
            assert sub.nodes() == {f"{HOST}:{target.port}"}
            assert len(readers) == 1 and readers[0].done()
        finally:
            await sub.aclose()
            await client.aclose()

    asyncio.run(body())
