"""``durability="fsync"`` on a Valkey Cluster (issue 18): each write's WAITAOF goes to
the primary that ran it (WAITAOF has no key: a cluster client cannot route it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from redis.cluster import key_slot

from tests.cluster import Cluster
from tests.contract.ops import submit
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
        expected: Counter[str] = Counter()
        for ref in refs:
            slot = key_slot(Keys("toolq", cell_of(ref, CELLS)).op(ref).encode())
            expected[aof_cluster.owner(slot).id] += 1
        assert len(expected) == 3  # the writes were spread over every primary
        assert after - before == expected
    finally:
        client.close()
