"""A Cluster named by several seed nodes, and a Cluster's node away said as toolq's error.

``TOOLQ_REDIS_URL=redis://a:7000,b:7001,c:7002``: a process starts from any seed that
answers, so a first seed that is down (here: a port nothing ever listened on) stops
neither a client, nor ``toolq status``, nor a worker. With a primary SIGKILLed,
``tq.submit`` and ``tq.aio.submit`` raise ``errors.ServerUnavailable`` naming the node
that failed (not the seed, which is up), and ``toolq status`` says so in one line; with
every node stopped, a new client says no seed answered. (The Cluster's node timeout
outlasts the module: no failover, no CLUSTERDOWN.)
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import key_slot

from tests.cluster import HOST, Cluster, Node
from tests.helpers import (
    run_aio,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    stop_processes,
    wait_until,
)
from tests.integration.apps import cells_app
from tests.integration.cluster.conftest import (
    CELLS,
    cells_client,
    cells_env,
    committed,
    start_relay,
)
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.envelope import ToolSuccess
from toolq.core.keys import Keys
from toolq.process.waiting import CAP_S, FIRST_S

APP = cells_app.APP


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _seeds(cluster: Cluster, first: int) -> str:
    """A seeds URL whose first seed is ``first`` (a port), then two of the nodes."""
    ports = [first, cluster.nodes[0].port, cluster.nodes[1].port]
    return "redis://" + ",".join(f"{HOST}:{p}" for p in ports)


def _status(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    p = start_toolq(["status"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        stop_process(p, timeout=1)
    return subprocess.CompletedProcess(p.args, p.returncode, out.decode(), err.decode())


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three primaries, no replica, and a node timeout longer than the module: a killed
    primary stays a node that does not answer (what a client meets before a failover),
    never a Cluster that answers CLUSTERDOWN."""
    with Cluster(primaries=3, replicas=0, node_timeout_ms=120_000) as started:
        yield started


@pytest.fixture(scope="module")
def url(cluster: Cluster) -> str:
    return _seeds(cluster, _closed_port())


@pytest.fixture(scope="module")
def tq(url: str, broker_url: str) -> Iterator[ToolQueue]:
    client = cells_client(url, broker_url)
    yield client
    client.close()


def test_a_dead_first_seed_stops_no_client_status_or_worker(
    tq: ToolQueue, url: str, broker_url: str, provider: redis.Redis
) -> None:
    env = cells_env(url, broker_url)
    # Given a worker, a scheduler and a relay started on seeds whose first is dead
    procs = [
        start_worker(APP, url, env=env),
        start_scheduler(APP, url, env=env),
        start_relay(env),
    ]
    try:
        # When the client calls, sync and async
        ref = "seeds/sync"
        done = tq.call("pay", {}, operation_ref=ref, timeout=60)
        aio_done = run_aio(
            tq, lambda: tq.aio.call("pay", {}, operation_ref="seeds/aio", timeout=60)
        )
        # Then the calls ran, once each, through the seeds that answer
        assert isinstance(done, ToolSuccess) and isinstance(aio_done, ToolSuccess)
        assert committed(provider)[ref] == 1 and committed(provider)["seeds/aio"] == 1
        # and `toolq status` reads the Cluster through them too
        status = _status(env)
        assert status.returncode == 0, status.stderr
        assert "Traceback" not in status.stderr
        assert all(p.poll() is None for p in procs)
    finally:
        stop_processes(procs, timeout=5)


def _shard_away_from(cluster: Cluster, seed: Node) -> tuple[Node, str]:
    """A primary other than ``seed``, and a ref whose cell it serves."""
    for i in range(1000):
        ref = f"seeds/down/{i}"
        owner = cluster.owner(key_slot(Keys("toolq", cell_of(ref, CELLS)).tag.encode()))
        if owner is not seed:
            return owner, ref
    raise AssertionError("no cell away from the seed")


def test_a_node_away_is_server_unavailable_naming_it(
    cluster: Cluster, tq: ToolQueue, url: str, broker_url: str, tmp_path: Path
) -> None:
    env = cells_env(url, broker_url)
    seed = cluster.nodes[0]
    victim, ref = _shard_away_from(cluster, seed)
    # Given a primary SIGKILLed (its slots' node does not answer)
    victim.server.kill()

    # When a client submits to a cell of that shard, sync and async
    with pytest.raises(errors.ServerUnavailable) as sync:
        tq.submit("pay", {}, operation_ref=ref)
    with pytest.raises(errors.ServerUnavailable) as aio:
        run_aio(tq, lambda: tq.aio.submit("pay", {}, operation_ref=ref))
    # Then each names the node that failed, not the seed (which is up)
    for caught in (sync, aio):
        text = str(caught.value)
        assert caught.value.code == "QUEUE_UNAVAILABLE"
        assert f"{HOST}:{victim.port}" in text, text
        assert f"{HOST}:{seed.port}" not in text, text
    # and `toolq status` (which reads every cell) says so in one line
    status = _status(env)
    assert status.returncode != 0
    assert "Traceback" not in status.stderr, status.stderr
    assert f"{HOST}:{victim.port}" in status.stderr, status.stderr
    assert len(status.stderr.strip().splitlines()) == 1, status.stderr

    # Given every node stopped
    for node in cluster.live():
        node.server.kill()
    # When a new client submits
    fresh = cells_client(url, broker_url)
    try:
        with pytest.raises(errors.ServerUnavailable) as none:
            fresh.submit("pay", {}, operation_ref=ref)
    finally:
        fresh.close()
    # Then it says that no seed answered, naming them
    assert "cannot reach any seed node of the Cluster" in str(none.value)
    assert f"{HOST}:{seed.port}" in str(none.value)
    # and a worker started meanwhile prints no traceback (it waits, or exits in one line):
    # watched until it says it waits, then through its tries as the backoff climbs to
    # its cap (0.5, 1, 2, 2 s: waiting.FIRST_S, CAP_S), not a fixed 20 s
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker_err = start_toolq(
            ["worker", "--app", APP, "--redis-url", url, "--loglevel", "WARNING"],
            env=env,
            stderr=out.fileno(),
        )
    try:
        assert wait_until(
            lambda: worker_err.poll() is not None or b"unavailable" in log.read_bytes(), 60
        ), log.read_text(errors="replace")
        if worker_err.poll() is None:
            time.sleep(FIRST_S + 1 + 2 * CAP_S + 1)
    finally:
        stop_process(worker_err, timeout=5)
    err = log.read_bytes()
    assert b"Traceback" not in err, err.decode()
