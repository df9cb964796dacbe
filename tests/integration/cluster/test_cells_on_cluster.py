"""The ledger's scripts on a real Valkey Cluster, one cell per call, in outbox mode.

Operations spread over many cells go through SUBMIT, CLAIM, RENEW, APPLY (success)
and CLAIM_DUE, each call with its cell's keys, through redis-py's RedisCluster: no
script crosses a slot (the cluster would refuse it), every record, due entry and
outbox message is in its own cell, and the library reaches every primary.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from redis.cluster import RedisCluster, key_slot

from tests.cluster import Cluster
from tests.contract.ops import LEASE, NOW, QUEUE, TOOL, submit
from toolq.adapters.ledger import Ledger, scripts
from toolq.adapters.ledger.cluster import LedgerCluster
from toolq.core.cells import DEFAULT_CELLS, cell_of
from toolq.core.keys import Keys
from toolq.core.own_envelopes import success_envelope
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition

S = State
REFS = [f"op-{i}" for i in range(64)]


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[RedisCluster]:
    rc = LedgerCluster(startup_nodes=cluster.startup_nodes)
    try:
        yield rc
    finally:
        rc.close()


def _getkeys_calls(cluster: Cluster) -> int:
    """How many COMMAND GETKEYS the nodes answered (a client resolving keys by asking)."""
    total = 0
    for node in cluster.live():
        stats = node.client().info("commandstats")
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


@pytest.fixture
def ledger(client: RedisCluster) -> Iterator[Ledger]:
    client.flushall()  # FLUSHALL goes to every primary
    yield Ledger(client, "toolq", outbox=True)  # type: ignore[arg-type]


def _cell(ref: str) -> int:
    return cell_of(ref, DEFAULT_CELLS)


def _library_on(cluster: Cluster) -> list[bool]:
    name = scripts.function_name("submit").rsplit("_", 1)[0]
    return [
        any(lib["library_name"] == name for lib in node.call("FUNCTION", "LIST"))
        for node in cluster.primaries()
    ]


def test_a_call_cycle_in_many_cells(cluster: Cluster, ledger: Ledger) -> None:
    cells = {ref: _cell(ref) for ref in REFS}
    by_cell: dict[int, list[str]] = defaultdict(list)
    for ref, cell in cells.items():
        by_cell[cell].append(ref)
    # The refs land in many cells, and those cells on every primary.
    assert len(by_cell) > 40
    owners = {cluster.owner(key_slot(Keys("toolq", c).tag.encode())).port for c in by_cell}
    assert len(owners) == 3

    now = datetime.fromtimestamp(NOW / 1000, UTC)
    getkeys_before = _getkeys_calls(cluster)
    done, running = REFS[::2], REFS[1::2]
    for ref in REFS:
        cell = ledger.in_cell(cells[ref])
        assert submit(cell, ref).outcome == "created"
        assert cell.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
        assert cell.renew(NOW + 1, LEASE, [(ref, 1, "run", "w1")]) == []
    for ref in done:
        win = Transition(
            ref=ref,
            states=(S.RUNNING,),
            to=S.SUCCEEDED,
            by="w1",
            envelope=success_envelope(ref, TOOL, "call-1", {"n": 1}, now),
            remove_due=True,
            ttl=600,
            stats=("succeeded",),
        )
        assert ledger.in_cell(cells[ref]).apply([win], NOW + 2) == ["ok"]
    # The running ones' leases run out: each cell's CLAIM_DUE finds its own, and only them.
    found: dict[str, str] = {}
    for cell, refs in by_cell.items():
        rows = ledger.in_cell(cell).claim_due(NOW + 1 + LEASE + 1, 100, 5_000)
        assert {r["ref"] for r in rows} == set(refs) & set(running)
        found.update((r["ref"], r["state"]) for r in rows)
    assert found == dict.fromkeys(running, "running")

    for ref in REFS:
        cell = ledger.in_cell(cells[ref])
        record = cell.get(ref)
        assert record is not None
        assert record.state == (S.SUCCEEDED if ref in done else S.RUNNING)
        # Not in any other cell: the record exists under its own cell's tag only.
        assert ledger.get(ref) is None
        assert ledger.in_cell((cells[ref] + 1) % DEFAULT_CELLS).get(ref) is None
    succeeded = ledger.in_cell(cells[done[0]]).envelope(done[0])
    assert succeeded is not None and succeeded.ok

    for cell, refs in by_cell.items():
        k = Keys("toolq", cell)
        due = {m.decode() for m in ledger.redis.zrange(k.due, 0, -1)}
        assert due == set(refs) & set(running)
        entries = ledger.redis.xrange(k.outbox)
        assert sorted(e[b"message"].decode() for _, e in entries) == sorted(
            f"run {r}" for r in refs
        )
        assert {e[b"queue"].decode() for _, e in entries} == {QUEUE}
        stats = ledger.in_cell(cell).stats()
        assert stats.get(f"{TOOL}|succeeded", 0) == len(set(refs) & set(done))
    # The single-tag keys were never written: nothing crossed into today's layout.
    assert ledger.redis.exists(ledger.keys.due, ledger.keys.outbox) == 0
    assert all(_library_on(cluster))
    # LedgerCluster routed every FCALL by its keys: not one COMMAND GETKEYS was asked.
    assert _getkeys_calls(cluster) == getkeys_before


def test_pipelined_function_calls_go_to_their_cells_without_asking(
    cluster: Cluster, ledger: Ledger
) -> None:
    cells = [ledger.in_cell(_cell(ref)) for ref in REFS[:8]]
    for cell, ref in zip(cells, REFS, strict=False):
        submit(cell, ref)
    before = _getkeys_calls(cluster)
    pipe = ledger.redis.pipeline()
    for cell, ref in zip(cells, REFS, strict=False):
        keys = [*cell.calls.fixed, cell.keys.op(ref)]
        args = [cell.calls.notify, ref, 1, "w1", NOW, LEASE, "run", 0]
        pipe.execute_command(*cell.scripts.command("claim", keys, args))
    replies = pipe.execute()
    assert [r[0] for r in replies] == [b"claimed"] * 8
    assert _getkeys_calls(cluster) == before


def test_plain_redis_cluster_asks_a_node_for_the_keys_of_every_fcall(
    cluster: Cluster, ledger: Ledger
) -> None:
    # Why LedgerCluster exists: redis-py's own RedisCluster sends COMMAND GETKEYS
    # (with the whole call) to its default node before every FCALL.
    with cluster.connected(decode_responses=False) as plain:
        cell = Ledger(plain, "toolq", outbox=True).in_cell(_cell(REFS[0]))  # type: ignore[arg-type]
        before = _getkeys_calls(cluster)
        submit(cell, REFS[0])
        cell.claim(REFS[0], 1, "w1", NOW, LEASE)
        assert _getkeys_calls(cluster) - before >= 2


def test_a_primary_that_lost_the_library_gets_it_again(cluster: Cluster, ledger: Ledger) -> None:
    ref = REFS[0]
    cell = ledger.in_cell(_cell(ref))
    assert submit(cell, ref).outcome == "created"
    owner = cluster.owner(key_slot(cell.keys.tag.encode()))
    owner.call("FUNCTION", "FLUSH")
    assert not all(_library_on(cluster))
    # A fresh process: its first call loads into every primary (REPLACE where it is).
    fresh = Ledger(ledger.redis, "toolq", outbox=True).in_cell(_cell(ref))
    assert fresh.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
    assert all(_library_on(cluster))
    # A running process: FCALL answers "function not found", it reloads and retries.
    owner.call("FUNCTION", "FLUSH")
    assert cell.renew(NOW + 1, LEASE, [(ref, 1, "run", "w1")]) == []
    assert all(_library_on(cluster))


def test_a_failover_keeps_the_library_and_the_cells(cluster: Cluster, ledger: Ledger) -> None:
    ref = REFS[1]
    cell = ledger.in_cell(_cell(ref))
    assert submit(cell, ref).outcome == "created"
    assert cell.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
    client = ledger.redis
    assert client.execute_command(  # type: ignore[no-untyped-call]
        "WAIT", 1, 5000, target_nodes=client.get_node_from_key(cell.keys.op(ref))
    )
    victim, _ = cluster.kill_primary(key_slot(cell.keys.tag.encode()))
    try:
        # The promoted replica has the library (functions replicate) and the record.
        assert cell.renew(NOW + 1, LEASE, [(ref, 1, "run", "w1")]) == []
        record = cell.get(ref)
        assert record is not None and record.state is S.RUNNING
    finally:
        cluster.revive(victim)


def test_a_cell_moved_to_another_primary_keeps_working(cluster: Cluster, ledger: Ledger) -> None:
    ref = REFS[2]
    cell = ledger.in_cell(_cell(ref))
    assert submit(cell, ref).outcome == "created"
    slot = key_slot(cell.keys.tag.encode())
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    cluster.migrate_slot(slot, target)
    # The same client, its slot map now stale: FCALL follows MOVED to the new owner,
    # which has the library already (loaded on every primary).
    assert cell.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
    assert target.call("CLUSTER", "COUNTKEYSINSLOT", slot) >= 3  # record, due, outbox
    rows = cell.claim_due(NOW + LEASE + 1, 10, 5_000)
    assert [r["ref"] for r in rows] == [ref]
