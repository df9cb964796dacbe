"""``durability="fsync"`` on a Valkey Cluster (issue 18): each write's WAITAOF goes to
the primary that ran it (WAITAOF has no key: a cluster client cannot route it), from
the sync ledger and from ``tq.aio``."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest
from pydantic import SecretStr
from redis.cluster import key_slot

from tests.cluster import HOST, Cluster
from tests.contract.ops import submit
from tests.helpers import run_aio
from tests.integration.apps import cells_app
from toolq.cells import cell_of
from toolq.keys import Keys
from toolq.ledger import Ledger
from toolq.ledger.cluster import LedgerCluster

CELLS = 16


@pytest.fixture(scope="module")
def aof_cluster() -> Iterator[Cluster]:
    """Three primaries with AOF on (``appendfsync always``), no replicas."""
    with Cluster(primaries=3, replicas=0, appendonly=True) as started:
        yield started


def _expected(cluster: Cluster, refs: list[str]) -> Counter[str]:
    """Per primary, the writes of ``refs`` whose cells it serves."""
    expected: Counter[str] = Counter()
    for ref in refs:
        slot = key_slot(Keys("toolq", cell_of(ref, CELLS)).op(ref).encode())
        expected[cluster.owner(slot).id] += 1
    assert len(expected) == 3  # the writes were spread over every primary
    return expected


def _waitaofs(cluster: Cluster) -> Counter[str]:
    found: Counter[str] = Counter()
    for node in cluster.primaries():
        stats = node.client().info("commandstats")
        found[node.id] = int(stats.get("cmdstat_waitaof", {}).get("calls", 0))
    return found


def test_each_write_waits_for_the_disk_of_its_own_primary(aof_cluster: Cluster) -> None:
    client = LedgerCluster(startup_nodes=aof_cluster.startup_nodes)
    try:
        ledger = Ledger(client, "toolq", "fsync", outbox=True, cells=CELLS)  # type: ignore[arg-type]
        refs = [f"fsync/{i}" for i in range(24)]
        before = _waitaofs(aof_cluster)
        for ref in refs:
            assert submit(ledger, ref).outcome == "created"
        after = _waitaofs(aof_cluster)
        assert ledger.durable.current().wait  # the nodes can wait: nothing learned otherwise
        assert after - before == _expected(aof_cluster, refs)
    finally:
        client.close()


def test_each_submit_through_tq_aio_waits_for_its_own_primary(aof_cluster: Cluster) -> None:
    update = {
        "cells": CELLS,
        "cluster": True,
        "durability": "fsync",
        "redis_url": SecretStr(f"redis://{HOST}:{aof_cluster.nodes[0].port}"),
        "broker_url": SecretStr("redis://127.0.0.1:1/0"),  # outbox mode: never reached here
    }
    tq = cells_app.make(cells_app.SETTINGS.model_copy(update=update))
    refs = [f"aio-fsync/{i}" for i in range(24)]

    async def body() -> bool:
        for ref in refs:
            assert (await tq.aio.submit("pay", {}, operation_ref=ref)).created
        return (await tq.aio._bound_to[asyncio.get_running_loop()].ledger.durable.current()).wait

    try:
        before = _waitaofs(aof_cluster)
        assert run_aio(tq, body)  # the nodes can wait: nothing learned otherwise
        assert _waitaofs(aof_cluster) - before == _expected(aof_cluster, refs)
    finally:
        tq.close()
