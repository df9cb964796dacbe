"""Cells mode on a real Valkey Cluster (issue 18): what a user runs.

The ledger in 16 cells spread over three primaries (``TOOLQ_CLUSTER=1``), Celery's
broker a plain Valkey (outbox mode), real worker, scheduler and relay processes.
Calls in every cell complete once each; a primary SIGKILLed mid-run (its replica
takes over) loses none, doubles none and strands none.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from click.testing import CliRunner
from redis.cluster import key_slot

from tests.cluster import Cluster
from tests.integration.apps import cells_app
from tests.integration.cluster.conftest import CELLS, cells_env, committed, node_url
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.keys import Keys
from toolq.edges.cli import main

APP = cells_app.APP


@pytest.fixture(scope="module")
def tq(deployed: ToolQueue) -> ToolQueue:
    return deployed


def test_calls_in_every_cell_complete_once_each_on_their_node(
    tq: ToolQueue, provider: redis.Redis, cluster: Cluster
) -> None:
    refs = [f"cluster/ok/{i}" for i in range(48)]
    assert {cell_of(ref, CELLS) for ref in refs} == set(range(CELLS))
    for ref in refs:
        tq.submit("pay", {}, operation_ref=ref)
    for ref in refs:
        assert tq.wait(ref, timeout=30).ok
    effects = committed(provider)
    assert all(effects[ref] == 1 for ref in refs)
    # each record lives on the primary that serves its cell's slot
    for ref in refs[:8]:
        key = Keys("toolq", cell_of(ref, CELLS)).op(ref)
        assert cluster.owner(key_slot(key.encode())).client().exists(key)
    # the cells are on every primary, not one
    owners = {cluster.owner(key_slot(Keys("toolq", c).due.encode())).id for c in range(CELLS)}
    assert len(owners) == 3


def test_a_primary_killed_mid_run_loses_doubles_and_strands_nothing(
    tq: ToolQueue, provider: redis.Redis, cluster: Cluster
) -> None:
    refs = [f"cluster/kill/{i}" for i in range(60)]
    retried = [f"cluster/kill-rl/{i}" for i in range(6)]
    # a primary serving some of these calls' cells, not the one the processes start from
    slots = [key_slot(Keys("toolq", cell_of(r, CELLS)).due.encode()) for r in refs]
    slot = next(s for s in slots if cluster.owner(s) is not cluster.nodes[0])
    submitted: list[str] = []

    def submit_all() -> None:
        for ref in refs:
            # what an agent does when the server is away: the same call again (same ref)
            deadline = time.monotonic() + 20
            while True:
                try:
                    tq.submit("pay", {}, operation_ref=ref)
                    break
                except errors.ServerUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            submitted.append(ref)

    for ref in retried:
        tq.submit("pay", {"mode": "rate_limited"}, operation_ref=ref)
    writer = threading.Thread(target=submit_all)
    writer.start()
    victim, took = cluster.kill_primary(slot)
    writer.join(timeout=60)
    try:
        assert submitted == refs
        for ref in refs + retried:
            result = tq.wait(ref, timeout=45)
            assert result.ok, (ref, result)
        effects = committed(provider)
        doubled = [r for r in refs + retried if effects[r] > 1]
        lost = [r for r in refs + retried if effects[r] == 0]
        assert doubled == [] and lost == []
        for ref in refs + retried:
            record = tq.get(ref)
            assert record is not None and record.state == "succeeded"
        print(f"failover took {took:.2f} s")
    finally:
        cluster.revive(victim)


def test_a_cell_migrated_mid_run_loses_doubles_and_strands_nothing(
    tq: ToolQueue, provider: redis.Redis, cluster: Cluster
) -> None:
    # calls in one cell (and a few retried there), while the cell's slot moves
    cell = 3
    refs = [f"cluster/move/{i}" for i in range(400) if cell_of(f"cluster/move/{i}", CELLS) == cell]
    retried = refs[:3]
    slot = key_slot(Keys("toolq", cell).due.encode())
    target = next(p for p in cluster.primaries() if p is not cluster.owner(slot))
    for ref in refs[3:]:
        tq.submit("pay", {}, operation_ref=ref)
    for ref in retried:
        tq.submit("pay", {"mode": "rate_limited"}, operation_ref=ref)
    cluster.migrate_slot(slot, target)
    assert cluster.owner(slot) is target
    for ref in refs:
        assert tq.wait(ref, timeout=45).ok, ref
    effects = committed(provider)
    assert [r for r in refs if effects[r] != 1] == []
    # the cell's records, due set and outbox moved with it
    assert target.client().exists(Keys("toolq", cell).op(refs[0]))


def test_toolq_status_reads_every_node(tq: ToolQueue, cluster: Cluster, broker_url: str) -> None:
    # `toolq status` without --app reads with the settings alone: on a Cluster it needs
    # the cluster client (a plain one was answered MOVED by the nodes)
    refs = [f"cluster/status/{i}" for i in range(16)]
    for ref in refs:
        tq.submit("pay", {}, operation_ref=ref)
    for ref in refs:
        assert tq.wait(ref, timeout=30).ok
    env = cells_env(node_url(cluster), broker_url)
    result = CliRunner().invoke(main, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    snap = json.loads(result.output)
    assert snap["tools"]["pay"]["states"]["succeeded"] >= len(refs)
