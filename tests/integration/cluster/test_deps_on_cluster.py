"""Dependency keys on a Valkey Cluster (cells): a key read in its own cell's slot, a lift
whose held-back calls live in other cells (other slots, other nodes) making each due, and
the asyncio side on the cluster client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import Cluster
from tests.helpers import run_aio
from tests.integration.cluster.conftest import cells_client, node_url
from tests.integration.test_deps_operator import seed_dep, seed_held_back
from toolq import ToolQueue
from toolq.core.deps import dep_cell


@pytest.fixture
def tq(cluster: Cluster, broker_url: str) -> Iterator[ToolQueue]:
    client = cells_client(node_url(cluster), broker_url)
    yield client
    client.close()


def test_a_lift_on_a_cluster_makes_calls_in_other_cells_due(tq: ToolQueue) -> None:
    layout = tq.app.topology.layout
    assert layout.cells is not None
    now = tq.app.now_ms()
    later = now + 600_000
    refs = [f"deps-cluster/{i}" for i in range(12)]
    cells = {layout.keys_of(r).cell for r in refs}
    assert len(cells) > 3  # spread over several slots
    seed_dep(tq.redis, layout, "stripe:acct_9", now, waiting={r: later for r in refs},
             paused_until=later, breaker="open")  # fmt: skip
    for ref in refs:
        seed_held_back(tq.redis, layout, ref, "stripe:acct_9", later, "waiting_retry")

    [view] = [v for v in tq.deps.list() if v.key == "stripe:acct_9"]
    assert view.cell == dep_cell("stripe:acct_9", layout.cells)
    assert (view.waiting, view.breaker) == (12, "open")

    done = tq.deps.lift("stripe:acct_9", reason="incident over")
    assert done.made_due == 12
    for ref in refs:
        due = tq.redis.zscore(layout.keys_of(ref).due, ref)
        assert due is not None and due < now + 600_000 - 1000

    closed = run_aio(tq, lambda: tq.aio.deps.close("stripe:acct_9", reason="back"))
    assert closed.dependency.breaker == "closed"
    assert [a.what for a in closed.dependency.actions] == ["close", "lift"]
