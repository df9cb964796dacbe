"""The hidden-fault classics on a real Valkey Cluster (issue 18), each with real
processes and real SIGKILLs: a lost reply, a worker killed mid-write, a relay
killed between the XADD and the publish (and one killed between the publish and
the acknowledgement), a scheduler killed while it holds cells.

The deployment of test_cells_mode_on_cluster.py (the ledger in 16 cells over three
primaries, Celery's broker and the provider's store a plain Valkey database, outbox
mode), with two schedulers and the processes a test kills replaced after it. Each
test ends with the same check: every call succeeded once on the provider and the
ledger says so (0 doubled, 0 lost, 0 stuck; the two agree). The primary SIGKILL, a
rate limit and a slot migrated mid-run are test_cells_mode_on_cluster.py's.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import key_slot

from tests.cluster import Cluster
from tests.contract.ops import submit
from tests.helpers import (
    REPO_ROOT,
    kill_group,
    start_scheduler,
    start_worker,
    stop_process,
    stop_processes,
    toolq_env,
    wait_until,
)
from tests.integration.apps import cells_app
from tests.integration.cluster.conftest import (
    CELLS,
    cells_client,
    cells_env,
    committed,
    node_url,
    start_relay,
)
from toolq import State, ToolQueue
from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.aio import AsyncScripts
from toolq.adapters.ledger.cluster import AsyncLedgerCluster, LedgerCluster
from toolq.core.cells import cell_of
from toolq.core.keys import OUTBOX_GROUP, Keys
from toolq.process.procs import pdeathsig_preexec

APP = cells_app.APP
OUTBOXES = [Keys("toolq", c).outbox for c in range(CELLS)]


@pytest.fixture(scope="module")
def env(cluster: Cluster, broker_url: str) -> dict[str, str]:
    """What every process of the deployment is started with (the broker and the
    provider's store: a plain Valkey database, conftest's ``broker_url``)."""
    return cells_env(node_url(cluster), broker_url)


@pytest.fixture(scope="module")
def tq(env: dict[str, str]) -> Iterator[ToolQueue]:
    client = cells_client(env["TOOLQ_REDIS_URL"], env["TOOLQ_BROKER_URL"])
    yield client
    client.close()


def start_dying_relay(env: dict[str, str], when: str) -> subprocess.Popen[bytes]:
    """A relay that SIGKILLs itself after reading (``read``) or publishing
    (``published``) its first batch (tests/integration/apps/dying_relay.py)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.apps.dying_relay", when, APP],
        env=toolq_env(env),
        cwd=str(REPO_ROOT),
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
    )


@pytest.fixture(scope="module", autouse=True)
def deployment(tq: ToolQueue, env: dict[str, str]) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The processes by role; a test that kills one puts its successor here."""
    url = env["TOOLQ_REDIS_URL"]
    procs = {
        "worker": start_worker(APP, url, env=env, concurrency=8),
        "scheduler-1": start_scheduler(APP, url, env=env),
        "scheduler-2": start_scheduler(APP, url, env=env),
        "relay": start_relay(env),
    }
    # the relay made every outbox's consumer group (before a test stops it), and the
    # schedulers hold every cell
    assert wait_until(lambda: _groups_made(tq) and len(_holders(tq)) == CELLS, 30)
    yield procs
    stop_processes(procs.values(), timeout=5)


def _agree(tq: ToolQueue, provider: redis.Redis, refs: list[str]) -> None:
    """Every call succeeded once on the provider, and the ledger says succeeded."""
    effects = committed(provider)
    assert [r for r in refs if effects[r] > 1] == []  # doubled
    assert [r for r in refs if effects[r] == 0] == []  # lost
    states = {ref: getattr(tq.get(ref), "state", None) for ref in refs}
    assert {r: s for r, s in states.items() if s is not State.SUCCEEDED} == {}


def _outbox(tq: ToolQueue) -> tuple[int, int]:
    """(entries, of which pending with a relay) over every cell's outbox."""
    pipe = tq.redis.pipeline(transaction=False)
    for stream in OUTBOXES:
        pipe.xlen(stream)
        pipe.xpending(stream, OUTBOX_GROUP)
    answers = pipe.execute()
    return sum(answers[0::2]), sum(int(p["pending"]) for p in answers[1::2])


def _groups_made(tq: ToolQueue) -> bool:
    pipe = tq.redis.pipeline(transaction=False)
    for stream in OUTBOXES:
        pipe.exists(stream)
    return all(pipe.execute())


def _holders(tq: ToolQueue) -> dict[int, str]:
    """Cell -> the scheduler holding its lease (cells nobody holds left out)."""
    pipe = tq.redis.pipeline(transaction=False)
    for cell in range(CELLS):
        pipe.get(Keys("toolq", cell).cell_lease)
    return {c: h.decode() for c, h in enumerate(pipe.execute()) if h is not None}


def test_lost_replies_in_every_cell_are_verified_not_written_again(
    tq: ToolQueue, provider: redis.Redis
) -> None:
    refs = [f"faults/lost/{i}" for i in range(32)]
    assert len({cell_of(ref, CELLS) for ref in refs}) >= CELLS - 2
    for ref in refs:
        tq.submit("pay", {"mode": "lost_reply"}, operation_ref=ref)
    for ref in refs:
        result = tq.wait(ref, timeout=30)
        assert result.ok, (ref, result)
        assert result.verification.evidence_ref == "verification:find_payment"
    _agree(tq, provider, refs)


def test_a_worker_killed_mid_write_has_its_writes_verified_not_run_again(
    tq: ToolQueue,
    provider: redis.Redis,
    deployment: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
) -> None:
    # Given writes that have committed and are still inside the tool, in several cells
    refs = [f"faults/worker-kill/{i}" for i in range(4)]
    for ref in refs:
        tq.submit("pay", {"sleep": 60}, operation_ref=ref)

    def committed_and_running() -> bool:
        effects = committed(provider)
        records = [tq.get(ref) for ref in refs]
        return all(effects[ref] == 1 for ref in refs) and all(
            r is not None and r.state is State.RUNNING for r in records
        )

    assert wait_until(committed_and_running, 30)

    # When the whole worker dies (its messages stay unacknowledged in the broker)
    kill_group(deployment["worker"])
    deployment["worker"] = start_worker(APP, env["TOOLQ_REDIS_URL"], env=env, concurrency=8)

    # Then each cell's scheduler finds the lease run out and verification settles the write
    for ref in refs:
        result = tq.wait(ref, timeout=45)
        assert result.ok, (ref, result)
        assert result.verification.evidence_ref == "verification:find_payment"
        record = tq.get(ref)
        assert record is not None
        assert [h.to for h in record.history][-2:] == [State.VERIFYING, State.SUCCEEDED]
    _agree(tq, provider, refs)


def test_a_relay_killed_between_xadd_and_publish_leaves_its_entries_to_another(
    tq: ToolQueue,
    provider: redis.Redis,
    deployment: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
) -> None:
    # Given calls whose messages are in their cells' outboxes, and no relay running
    stop_process(deployment["relay"], timeout=5)
    refs = [f"faults/relay-read/{i}" for i in range(12)]
    for ref in refs:
        tq.submit("pay", {}, operation_ref=ref)
    assert _outbox(tq) == (len(refs), 0)

    # When a relay reads them all and is SIGKILLed before it publishes any
    dying = start_dying_relay(env, "read")
    assert dying.wait(timeout=30) == -signal.SIGKILL
    assert _outbox(tq) == (len(refs), len(refs))  # pending with the dead relay
    assert all(committed(provider)[ref] == 0 for ref in refs)

    # Then another relay takes them over (XAUTOCLAIM) and each call runs once
    deployment["relay"] = start_relay(env)
    for ref in refs:
        assert tq.wait(ref, timeout=30).ok, ref
    _agree(tq, provider, refs)
    assert wait_until(lambda: _outbox(tq) == (0, 0), 10), _outbox(tq)
    for ref in refs:
        record = tq.get(ref)
        assert record is not None and record.attempt == 1


def test_a_relay_killed_between_publish_and_ack_causes_copies_the_claim_refuses(
    tq: ToolQueue,
    provider: redis.Redis,
    deployment: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
) -> None:
    before = tq.app.ledger.stats().get("pay|duplicates_prevented", 0)
    # Given calls published, run, and never acknowledged in their outboxes
    stop_process(deployment["relay"], timeout=5)
    refs = [f"faults/relay-published/{i}" for i in range(6)]
    for ref in refs:
        tq.submit("pay", {}, operation_ref=ref)
    dying = start_dying_relay(env, "published")
    assert dying.wait(timeout=30) == -signal.SIGKILL
    for ref in refs:
        assert tq.wait(ref, timeout=30).ok, ref
    assert _outbox(tq) == (len(refs), len(refs))

    # When another relay takes the entries over and publishes them again
    deployment["relay"] = start_relay(env)
    assert wait_until(lambda: _outbox(tq) == (0, 0), 20), _outbox(tq)

    # Then the workers got the copies and their claims refused them: nothing ran twice
    def refused() -> int:
        return tq.app.ledger.stats().get("pay|duplicates_prevented", 0) - before

    assert wait_until(lambda: refused() == len(refs), 20), refused()
    _agree(tq, provider, refs)


def test_a_scheduler_killed_holding_cells_has_their_retries_dispatched_by_the_other(
    tq: ToolQueue,
    provider: redis.Redis,
    deployment: dict[str, subprocess.Popen[bytes]],
    env: dict[str, str],
) -> None:
    # Given two schedulers sharing the cells
    victim = deployment["scheduler-2"]
    assert wait_until(
        lambda: len(_holders(tq)) == CELLS and len(set(_holders(tq).values())) == 2, 30
    ), _holders(tq)
    theirs = [c for c, h in _holders(tq).items() if h.split(":")[1] == str(victim.pid)]
    assert 0 < len(theirs) < CELLS

    # When one is SIGKILLed: its leases stand until they run out
    kill_group(victim)
    assert [c for c, h in _holders(tq).items() if h.split(":")[1] == str(victim.pid)] == theirs

    # and calls in its cells are rate limited twice (two retries fall due there)
    refs = []
    for i in range(400):
        ref = f"faults/scheduler/{i}"
        if cell_of(ref, CELLS) in theirs and cell_of(ref, CELLS) not in map(_cell, refs):
            refs.append(ref)
    assert sorted(map(_cell, refs)) == sorted(theirs)
    for ref in refs:
        tq.submit("pay", {"mode": "rate_limited"}, operation_ref=ref)

    # Then the other takes its cells over and dispatches every retry
    for ref in refs:
        result = tq.wait(ref, timeout=45)
        assert result.ok, (ref, result)
        record = tq.get(ref)
        assert record is not None and record.attempt == 3
    _agree(tq, provider, refs)
    assert len(set(_holders(tq).values())) == 1 and len(_holders(tq)) == CELLS
    deployment["scheduler-2"] = start_scheduler(APP, env["TOOLQ_REDIS_URL"], env=env)


def test_a_ledger_whose_map_predates_a_failover_and_revive_still_loads_its_scripts(
    cluster: Cluster, env: dict[str, str]
) -> None:
    # Given a ledger client that read the cluster's map and has not loaded its scripts
    # yet (a prefork pool child whose parent read the map before it forked)
    client = LedgerCluster.from_url(env["TOOLQ_REDIS_URL"])
    ledger = Ledger(client, "toolq", "none", outbox=True, cells=CELLS)  # type: ignore[arg-type]
    startup = cluster.nodes[0]
    ref = next(
        f"faults/stale-map/{i}"
        for i in range(100)
        if cluster.owner(key_slot(Keys("toolq", _cell(f"faults/stale-map/{i}")).due.encode()))
        is not startup
    )
    # When the primary of its cell fails over and comes back as a replica, at the
    # address the map still calls a primary's
    victim, _ = cluster.kill_primary(key_slot(Keys("toolq", _cell(ref)).due.encode()))
    try:
        cluster.revive(victim)
        assert victim not in cluster.primaries()
        # Then its first call loads the scripts (on the primaries as they are now) and runs
        assert submit(ledger, ref).outcome == "created"
    finally:
        client.close()


def test_an_async_client_whose_map_predates_a_failover_and_revive_still_loads_its_scripts(
    cluster: Cluster, env: dict[str, str]
) -> None:
    # The same for tq.aio's client: its map read, then a primary (not the startup
    # node) fails over and comes back as a replica at the address the map names
    victim = next(p for p in cluster.primaries() if p is not cluster.nodes[0])
    slot = next(s for s in range(16384) if cluster.owner(s) is victim)

    async def load_after_failover() -> None:
        client = AsyncLedgerCluster.from_url(env["TOOLQ_REDIS_URL"])
        try:
            await client.initialize()
            dead, _ = await asyncio.to_thread(cluster.kill_primary, slot)
            await asyncio.to_thread(cluster.revive, dead)
            assert dead not in cluster.primaries()
            scripts = AsyncScripts(client)
            await scripts.load()  # FUNCTION LOAD to every primary on the map
            assert scripts.functions is True
        finally:
            await client.aclose()

    asyncio.run(load_after_failover())


def _cell(ref: str) -> int:
    return cell_of(ref, CELLS)
