"""The cluster fixture itself: a real cluster, that fails over and migrates slots."""

from __future__ import annotations

from redis.cluster import key_slot

from tests.cluster import Cluster


def test_answers_through_redis_cluster(cluster: Cluster) -> None:
    with cluster.connected() as client:
        primaries = {f"{n.host}:{n.port}" for n in client.get_primaries()}
        assert len(primaries) == 3
        assert len(client.get_replicas()) == 3
        # Keys in many slots: each lands on the primary serving its slot.
        for i in range(30):
            client.set(f"k{i}", i)
        assert [int(client.get(f"k{i}")) for i in range(30)] == list(range(30))
        owners = {cluster.owner(key_slot(f"k{i}".encode())).port for i in range(30)}
    assert len(owners) == 3


def test_failover_keeps_a_written_key(cluster: Cluster) -> None:
    key = "{failover}:k"
    slot = key_slot(key.encode())
    with cluster.connected() as client:
        client.set(key, "kept")
        # WAIT: the replica has the write before its primary dies.
        assert client.execute_command("WAIT", 1, 5000, target_nodes=client.get_node_from_key(key))
    before = cluster.owner(slot)
    victim, _ = cluster.kill_primary(slot)
    try:
        assert victim is before
        assert cluster.owner(slot) is not victim
        with cluster.connected() as client:
            assert client.get(key) == "kept"
    finally:
        cluster.revive(victim)
    assert cluster.replicas_of(cluster.owner(slot)) == [victim]


def test_migrated_slot_keeps_its_keys(cluster: Cluster) -> None:
    keys = [f"{{migrate}}:k{i}" for i in range(50)]
    slot = key_slot(keys[0].encode())
    with cluster.connected() as client:
        for i, key in enumerate(keys):
            client.set(key, i)
        source = cluster.owner(slot)
        target = next(p for p in cluster.primaries() if p is not source)
        cluster.migrate_slot(slot, target)
        assert cluster.owner(slot) is target
        assert target.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 50
        assert source.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        # The client follows the MOVED reply to the new owner.
        assert [int(client.get(k)) for k in keys] == list(range(50))
