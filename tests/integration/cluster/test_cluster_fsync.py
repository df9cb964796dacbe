"""``durability="fsync"`` on a Valkey Cluster (issue 18): each write is held on the
disk of the primary that ran it (WAITAOF) and by a replica of its shard (WAIT), both
sent on the connection that ran the write (they count that connection's writes),
from the sync ledger, from ``tq.aio`` and through a real worker.

A replica that cannot acknowledge is made with ``CLIENT PAUSE WRITE`` on it: it
stops applying its primary's stream, so it acknowledges nothing, while its cluster
bus still answers (the cluster does not mark it failed). A WAIT sent on any other
connection than the write's would answer at once there (what that connection
wrote before is on the replica already), so these tests fail if the waits leave
the write's connection.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from pydantic import SecretStr
from redis.cluster import key_slot

from tests.cluster import HOST, Cluster, Node, wait_for
from tests.contract.ops import LEASE, NOW, submit
from tests.helpers import run_aio
from tests.integration.apps import cells_app
from tests.integration.cluster.conftest import CELLS, deployment
from toolq import ToolQueue
from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.cluster import LedgerCluster
from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.keys import Keys
from toolq.core.states import State


@pytest.fixture(scope="module")
def aof_cluster() -> Iterator[Cluster]:
    """Three primaries with AOF on (``appendfsync always``), a replica each."""
    with Cluster(primaries=3, replicas=1, appendonly=True) as started:
        yield started


@pytest.fixture
def ledger(aof_cluster: Cluster) -> Iterator[Ledger]:
    client = LedgerCluster(startup_nodes=aof_cluster.startup_nodes)
    yield Ledger(client, "toolq", "fsync", outbox=True, cells=CELLS)  # type: ignore[arg-type]
    client.close()


def _slot(ref: str) -> int:
    return key_slot(Keys("toolq", cell_of(ref, CELLS)).op(ref).encode())


def _expected(cluster: Cluster, refs: list[str]) -> Counter[str]:
    """Per primary, the writes of ``refs`` whose cells it serves."""
    expected: Counter[str] = Counter(cluster.owner(_slot(ref)).id for ref in refs)
    assert len(expected) == 3  # the writes were spread over every primary
    return expected


def _calls(cluster: Cluster, command: str) -> Counter[str]:
    """Per live primary, how many times it ran ``command`` (INFO commandstats)."""
    return Counter({node.id: _calls_on(node, command) for node in cluster.primaries()})


def _calls_on(node: Node, command: str) -> int:
    stats = node.client().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _waits(cluster: Cluster) -> tuple[Counter[str], Counter[str]]:
    return _calls(cluster, "waitaof"), _calls(cluster, "wait")


@contextmanager
def _unacknowledging(replica: Node) -> Iterator[None]:
    """The replica applies (and acknowledges) nothing from its primary meanwhile."""
    replica.call("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        yield
    finally:
        replica.call("CLIENT", "UNPAUSE")


def _replica_of(cluster: Cluster, ref: str) -> Node:
    return cluster.replicas_of(cluster.owner(_slot(ref)))[0]


def _together(fns: list[Callable[[], Any]]) -> list[Exception | None]:
    """Run ``fns`` at once on threads (the client's pool then has one connection each
    in use); what each raised."""
    barrier = threading.Barrier(len(fns))

    def one(fn: Callable[[], Any]) -> Exception | None:
        barrier.wait()
        try:
            fn()
        except Exception as exc:  # returned to the test
            return exc
        return None

    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(one, fns))


def test_each_write_waits_for_the_disk_and_a_replica_of_its_own_primary(
    aof_cluster: Cluster, ledger: Ledger
) -> None:
    refs = [f"fsync/{i}" for i in range(24)]
    before = _waits(aof_cluster)
    # from 8 threads at once: several pooled connections per node in use
    assert _together([lambda r=r: submit(ledger, r) for r in refs]) == [None] * len(refs)
    aof, wait = _waits(aof_cluster)
    plan = ledger.durable.current(replicas=1)
    assert plan.wait and plan.replica  # the nodes can wait: nothing learned otherwise
    assert aof - before[0] == _expected(aof_cluster, refs)
    assert wait - before[1] == _expected(aof_cluster, refs)
    assert all(ledger.get(r).state is State.QUEUED for r in refs)  # type: ignore[union-attr]


def test_no_write_is_acted_on_until_a_replica_has_it(aof_cluster: Cluster, ledger: Ledger) -> None:
    # Given refs on one shard, each written once while its replica is healthy (so each
    # pooled connection has writes the replica acknowledged), and one new
    refs = [r for r in (f"unacked/{i}" for i in range(60)) if _slot(r) == _slot("unacked/0")]
    old, new = refs[:4], refs[4:8]
    for ref in old:
        submit(ledger, ref)
    replica = _replica_of(aof_cluster, old[0])
    # When it stops acknowledging: submits and claims from 8 threads at once
    with _unacknowledging(replica):
        raised = _together(
            [lambda r=r: submit(ledger, r) for r in new]
            + [lambda r=r: ledger.claim(r, 1, "w1", NOW, LEASE) for r in old]
        )
    # Then every one is refused: the primary ran each, no replica confirmed it
    assert all(isinstance(e, errors.NotDurable) for e in raised), raised
    assert all("replica" in str(e) for e in raised)
    # and the same calls again, the replica back, are acknowledged (same outcome)
    for ref in new:
        assert submit(ledger, ref).outcome == "exists"
    for ref in old:
        assert ledger.claim(ref, 1, "w1", NOW, LEASE).outcome in {"claimed", "held"}


def test_a_call_sent_again_on_a_new_connection_is_acted_on_only_once_a_replica_has_it(
    aof_cluster: Cluster, ledger: Ledger
) -> None:
    # Given a submit and a claim that ran (their replies may have been lost), then the
    # replica stopped acknowledging before it got them (made here by pausing it after)
    ref = "again/1"
    submit(ledger, ref)
    assert ledger.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
    replica = _replica_of(aof_cluster, ref)
    again = LedgerCluster(startup_nodes=aof_cluster.startup_nodes)
    try:
        other = Ledger(again, "toolq", "fsync", outbox=True, cells=CELLS)  # type: ignore[arg-type]
        # (a new client loads its scripts first: a write of its own, acknowledged here)
        assert other.claim("again/none", 1, "w1", NOW, LEASE).outcome == "missing"
        with _unacknowledging(replica):
            # When the same calls are sent again by that client (connections which wrote
            # nothing unacknowledged: their waits would answer at once if the calls
            # wrote nothing)
            raised = _together(
                [lambda: submit(other, ref), lambda: other.claim(ref, 1, "w1", NOW, LEASE)]
            )
    finally:
        again.close()
    # Then neither is acted on: each wrote again, and no replica confirmed that write
    assert all(isinstance(e, errors.NotDurable) for e in raised), raised


def test_a_write_after_its_slot_moved_waits_on_its_new_primary(
    aof_cluster: Cluster, ledger: Ledger
) -> None:
    ref = "moved/1"
    submit(ledger, "moved/0")  # the client's map is read: it is stale after the move
    slot = _slot(ref)
    target = next(n for n in aof_cluster.primaries() if n is not aof_cluster.owner(slot))
    aof_cluster.migrate_slot(slot, target)
    before = _waits(aof_cluster)
    assert submit(ledger, ref).outcome == "created"  # MOVED, the map again, sent again
    aof, wait = _waits(aof_cluster)
    # the new primary ran it and its waits (the old one refused the call: MOVED; the
    # waits pipelined behind it answered at once there, and nothing was acted on)
    assert (aof - before[0])[target.id] == (wait - before[1])[target.id] == 1
    assert target.client().exists(Keys("toolq", cell_of(ref, CELLS)).op(ref))


def test_a_replica_the_cluster_marks_failed_is_no_longer_waited_for(
    aof_cluster: Cluster, ledger: Ledger
) -> None:
    refs = [f"failed-replica/{i}" for i in range(200)]
    primary = aof_cluster.owner(_slot(refs[0]))
    replica = _replica_of(aof_cluster, refs[0])
    same_shard = iter([r for r in refs if aof_cluster.owner(_slot(r)) is primary])
    submit(ledger, next(same_shard))
    # Given its replica frozen (SIGSTOP: down, though the client's map lists it)
    os.kill(replica.server.pid, signal.SIGSTOP)
    refused: list[str] = []
    try:
        # When writes go on: refused while the cluster has not marked it failed...
        deadline = time.monotonic() + 20
        while True:
            ref = next(same_shard)
            try:
                submit(ledger, ref)
                break
            except errors.NotDurable:
                refused.append(ref)
                assert time.monotonic() < deadline
        # ... then, the map read again after a refusal, written without waiting for it
        before = _calls_on(primary, "wait")
        assert submit(ledger, next(same_shard)).outcome == "created"
        assert _calls_on(primary, "wait") == before
    finally:
        os.kill(replica.server.pid, signal.SIGCONT)
    assert refused  # the first write waited for it, and was refused
    # Then back: the next probe reads the map again, and the replica is waited for
    wait_for("the replica to be healthy", lambda: "fail" not in _flags(primary, replica))
    aof_cluster.wait_ok()
    wait_for("every node to list the replica", lambda: _listed(aof_cluster, replica))
    ledger.durable.plans._read_at -= 3600  # the probe is due
    before = _calls_on(primary, "wait")
    submit(ledger, next(same_shard))
    assert _calls_on(primary, "wait") == before + 1


def _flags(asker: Node, node: Node) -> str:
    for line in asker.call("CLUSTER", "NODES").splitlines():
        if line.startswith(node.id):
            return str(line.split()[2])
    return ""


def _listed(cluster: Cluster, replica: Node) -> bool:
    """Every live node's CLUSTER SLOTS lists ``replica`` (what a client's map reads)."""
    return all(
        any(int(r[1]) == replica.port for entry in n.call("CLUSTER", "SLOTS") for r in entry[3:])
        for n in cluster.live()
    )


# ------------------------------------------------------------------ tq.aio


def _aio_app(cluster: Cluster, durability: str = "fsync") -> ToolQueue:
    update = {
        "cells": CELLS,
        "cluster": True,
        "durability": durability,
        "redis_url": SecretStr(f"redis://{HOST}:{cluster.nodes[0].port}"),
        "broker_url": SecretStr("redis://127.0.0.1:1/0"),  # outbox mode: never reached here
    }
    return cells_app.make(cells_app.SETTINGS.model_copy(update=update))


def test_each_submit_through_tq_aio_waits_for_its_own_primary_and_replica(
    aof_cluster: Cluster,
) -> None:
    tq = _aio_app(aof_cluster)
    refs = [f"aio-fsync/{i}" for i in range(24)]

    async def body() -> bool:
        # at once: several of each node's connections in use
        await asyncio.gather(*(tq.aio.submit("pay", {}, operation_ref=r) for r in refs))
        durable = tq.aio._bound_to[asyncio.get_running_loop()].ledger.durable
        p = await durable.current(replicas=1)
        return p.wait and p.replica

    try:
        before = _waits(aof_cluster)
        assert run_aio(tq, body)  # the nodes can wait: nothing learned otherwise
        aof, wait = _waits(aof_cluster)
        assert aof - before[0] == _expected(aof_cluster, refs)
        assert wait - before[1] == _expected(aof_cluster, refs)
    finally:
        tq.close()


def test_tq_aio_acts_on_no_submit_until_a_replica_has_it(aof_cluster: Cluster) -> None:
    tq = _aio_app(aof_cluster)
    refs0 = "aio-unacked/0"
    refs = [r for r in (f"aio-unacked/{i}" for i in range(60)) if _slot(r) == _slot(refs0)]
    old, new = refs[:3], refs[3:6]

    async def submit_all(batch: list[str]) -> list[BaseException | Any]:
        calls = (tq.aio.submit("pay", {}, operation_ref=r) for r in batch)
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        run_aio(tq, lambda: submit_all(old))
        with _unacknowledging(_replica_of(aof_cluster, old[0])):
            raised = run_aio(tq, lambda: submit_all(new))
        assert all(isinstance(e, errors.NotDurable) for e in raised), raised
        again = run_aio(tq, lambda: submit_all(new))  # the replica back: the same calls
        assert [r.created for r in again] == [False] * len(new)
    finally:
        tq.close()


# ------------------------------------------------------------------ a real worker


@pytest.fixture(scope="module")
def worked(aof_cluster: Cluster, broker_url: str) -> Iterator[ToolQueue]:
    """A worker, a scheduler and a relay with ``durability=fsync``; the test's own
    client submits with ``none`` (its submits are not what these tests refuse)."""
    yield from deployment(aof_cluster, broker_url, durability="fsync", concurrency=4)


def test_a_worker_does_not_call_a_tool_whose_claim_no_replica_has(
    aof_cluster: Cluster, worked: ToolQueue, broker_url: str
) -> None:
    provider = redis.Redis.from_url(broker_url)
    ref = "worker-unacked/1"
    try:
        worked.submit("pay", {}, operation_ref="worker-warm/1")  # the processes are up
        assert worked.wait("worker-warm/1", timeout=30).ok
        # Given the replica of the call's shard acknowledging nothing
        with _unacknowledging(_replica_of(aof_cluster, ref)):
            worked.submit("pay", {}, operation_ref=ref)
            # When the worker claims the call: the claim is not confirmed
            wait_for("the claim to be refused", lambda: _left_running(worked, ref), 30)
            # Then the tool was not called
            assert provider.lrange("provider:effects", 0, -1).count(ref.encode()) == 0
        # and once the replica is back the operation is settled as usual: once
        result = worked.wait(ref, timeout=45)
        assert result.ok, result
        assert provider.lrange("provider:effects", 0, -1).count(ref.encode()) == 1
    finally:
        provider.close()


def _left_running(tq: ToolQueue, ref: str) -> bool:
    """A claim of ``ref`` left ``running`` without an outcome: given back to ``queued``
    by the worker, or (this app's lease, 1.5 s, is shorter than the 2 s the claim
    waited) taken by the lease sweep to ``verifying``."""
    record = tq.get(ref)
    history = record.history if record is not None else []
    left = {State.QUEUED, State.VERIFYING}
    return any(h.from_ is State.RUNNING and h.to in left for h in history)
