"""From one server to a Valkey Cluster, cells spread evenly (issue 18, docs/cells.md).

The whole path a deployment takes, with the commands it would run: a single-tag
ledger with operations in every state (and calls queued with no worker to run
them) on one server with AOF; ``toolq cells migrate``; the server stopped and
started again on its data with ``cluster-enabled yes``; ``toolq cells adopt``
(the slots it did not claim, two empty primaries met); ``toolq cells balance``.
Then every operation reads back through toolq in cluster mode, and real worker,
scheduler and relay processes (outbox mode, a plain Valkey as the broker) run the
calls queued before the move and new ones, once each.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import redis
from click.testing import CliRunner
from pydantic import SecretStr
from redis.cluster import key_slot

from tests.cluster import HOST, Cluster, free_port
from tests.contract.ops import single_tag_ledger
from tests.helpers import start_scheduler, start_worker, stop_processes
from tests.integration.apps import cells_app
from tests.integration.cluster.conftest import CELLS, cells_client, cells_env, start_relay
from toolq.adapters.embedded import EmbeddedServer
from toolq.core.cells import cell_of
from toolq.core.keys import Keys
from toolq.core.settings import ToolqSettings
from toolq.edges.cli import main

APP = cells_app.APP


def _settings(url: str, **update: object) -> ToolqSettings:
    return cells_app.SETTINGS.model_copy(
        update={"durability": "none", "redis_url": SecretStr(url), **update}
    )


def _toolq(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _cells_per_primary(cluster: Cluster, cells: int = CELLS) -> list[int]:
    owners = Counter(
        cluster.owner(key_slot(Keys("toolq", c).due.encode())).port for c in range(cells)
    )
    return sorted(owners.get(p.port, 0) for p in cluster.primaries())


def test_a_single_server_becomes_a_balanced_cluster_and_every_operation_carries_on(
    tmp_path: Path, redis_url: str
) -> None:
    broker_url = redis_url  # Celery's broker after the move, and the provider's store
    data = tmp_path / "single"
    port = free_port()  # a Cluster node's port + 10000 must be a port too
    url = f"redis://{HOST}:{port}"

    # Given one server with AOF holding a single-tag ledger: operations in every state,
    # and calls queued (inline mode: their Celery messages in its lists) that no
    # worker ran before it stopped.
    single = EmbeddedServer(data, port=port, appendonly=True).start()
    try:
        with redis.Redis.from_url(url) as client:
            _, refs = single_tag_ledger(client)
            inline = cells_app.make(_settings(url))
            queued = [f"single/queued/{i}" for i in range(3)]
            for ref in queued:
                inline.submit("pay", {}, operation_ref=ref)
            inline.close()
            refs += queued
            records = {ref: client.hgetall(Keys("toolq").op(ref)) for ref in refs}
        # When it is moved into cells and stopped
        assert "TOOLQ_CELLS=16" in _toolq(
            "cells", "migrate", "--redis-url", url, "--cells", str(CELLS)
        )
    finally:
        single.stop()

    # ... started again on its data as a Cluster node, given the slots it did not
    # claim and two empty primaries, and balanced
    with Cluster(primaries=3, replicas=0).convert(data, port) as cluster:
        joining = [f"{HOST}:{n.port}" for n in cluster.nodes[1:]]
        out = _toolq(
            "cells", "adopt", "--redis-url", url, *(x for j in joining for x in ("--node", j))
        )
        assert "met" in out and "cluster_state:ok" in out
        cluster.wait_ok()
        assert _cells_per_primary(cluster) == [0, 0, CELLS]

        plan = _toolq("cells", "balance", "--redis-url", url, "--dry-run")
        assert f"{HOST}:{port}: 16 -> 6 cells" in plan and "10 slots to move" in plan
        assert _cells_per_primary(cluster) == [0, 0, CELLS]  # a dry run moves nothing
        assert "moved 10/10 slots" in _toolq("cells", "balance", "--redis-url", url)
        cluster.wait_ok()
        assert _cells_per_primary(cluster) == [5, 5, 6]
        assert "balanced already" in _toolq("cells", "balance", "--redis-url", url)

        # Then every operation reads back through toolq in cluster mode, as it was
        env = cells_env(url, broker_url)
        tq = cells_client(url, broker_url)
        with cluster.connected(decode_responses=False) as nodes:
            for ref in refs:
                record = tq.get(ref)
                assert record is not None and record.operation_ref == ref
                assert nodes.hgetall(Keys("toolq", cell_of(ref, CELLS)).op(ref)) == records[ref]
        moved = {
            cluster.owner(key_slot(Keys("toolq", cell_of(r, CELLS)).due.encode())).port
            for r in refs
        }
        assert len(moved) == 3  # the operations are on every primary now

        # ... and real processes run the calls queued before the move and new ones, once each
        procs = [
            start_worker(APP, url, env=env, concurrency=4),
            start_scheduler(APP, url, env=env),
            start_relay(env),
        ]
        try:
            fresh = [f"cluster/new/{i}" for i in range(12)]
            for ref in fresh:
                tq.submit("pay", {}, operation_ref=ref)
            for ref in fresh + queued:
                assert tq.wait(ref, timeout=45).ok, ref
            with redis.Redis.from_url(broker_url) as provider:
                effects = Counter(x.decode() for x in provider.lrange("provider:effects", 0, -1))
            assert {ref: effects[ref] for ref in fresh + queued} == dict.fromkeys(fresh + queued, 1)
        finally:
            stop_processes(procs, timeout=5)
            tq.close()


def _refused(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output
    return result.output


def test_balance_spreads_256_cells_over_equal_slot_ranges(cluster: Cluster) -> None:
    url = f"redis://{HOST}:{cluster.nodes[0].port}"
    assert "no cells are recorded in {toolq}:meta" in _refused(
        "cells", "balance", "--redis-url", url
    )
    with cluster.connected() as client:
        client.hset(Keys("toolq").meta, "cells", 256)
    by_ranges = _cells_per_primary(cluster, 256)
    assert max(by_ranges) > 86  # the 256 tags fall unevenly into equal ranges
    out = _toolq("cells", "balance", "--redis-url", url)
    cluster.wait_ok()
    assert _cells_per_primary(cluster, 256) == [85, 85, 86], out


def test_balance_and_adopt_refuse_what_is_not_theirs(redis_url: str, cluster: Cluster) -> None:
    assert "not a Cluster node" in _refused("cells", "balance", "--redis-url", redis_url)
    url = f"redis://{HOST}:{cluster.nodes[0].port}"
    member = f"{HOST}:{cluster.nodes[1].port}"
    # a node of another cluster (here: this one's, met already, so skipped) and a plain server
    assert "cluster_state:ok" in _toolq("cells", "adopt", "--redis-url", url, "--node", member)
    # ... the same by a host name (a re-run after an interrupted adopt given names):
    # CLUSTER NODES shows the IP it was met at
    by_name = f"localhost:{cluster.nodes[1].port}"
    assert "cluster_state:ok" in _toolq("cells", "adopt", "--redis-url", url, "--node", by_name)
    plain = redis_url.split("//", 1)[1].split("/", 1)[0]
    assert "is not a Cluster node" in _refused(
        "cells", "adopt", "--redis-url", url, "--node", plain
    )
    assert "is not host:port" in _refused("cells", "adopt", "--redis-url", url, "--node", "x")
