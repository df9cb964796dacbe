"""A real Valkey Cluster for tests: the embedded server binary, no valkey-cli.

:class:`Cluster` starts ``primaries`` nodes with ``replicas`` replicas each, every
node an :class:`toolq.adapters.embedded.EmbeddedServer` (so it dies with the test run) with
``cluster-enabled yes`` and a directory of its own under one temporary directory.
It assigns the slots itself (``CLUSTER ADDSLOTSRANGE``: the 16384 slots in equal
ranges), joins the nodes (``CLUSTER MEET``), attaches the replicas (``CLUSTER
REPLICATE``), and returns once every node says ``cluster_state:ok`` and agrees on
who serves every slot. :meth:`Cluster.convert` starts one around a single
server's data instead, and leaves the joining to ``toolq cells adopt``.

Chaos helpers: :meth:`Cluster.kill_primary` SIGKILLs the primary of a slot and
returns once its replica has taken over (automatic failover: the short
``cluster-node-timeout`` makes the others notice in about two timeouts);
:meth:`Cluster.revive` starts a killed node again, which rejoins as a replica
of its old shard. :meth:`Cluster.migrate_slot` moves one slot with Valkey 9's
atomic slot migration (``CLUSTER MIGRATESLOTS``, polled with ``CLUSTER
GETSLOTMIGRATIONS``).
"""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
from redis.cluster import ClusterNode, RedisCluster

from toolq.adapters.embedded import HOST, EmbeddedServer

SLOTS = 16384
#: Short, so that a killed primary's replica takes over in a few seconds; the
#: nodes are on loopback, where a second without an answer means dead.
NODE_TIMEOUT_MS = 1000
#: How often a node still short of peers while the cluster forms meets them again.
MEET_AGAIN_S = 2.0
#: A node's cluster bus listens on its port plus this.
BUS_OFFSET = 10_000


class ClusterError(RuntimeError):
    """The cluster did not reach the state asked for in time."""


@dataclass
class Node:
    server: EmbeddedServer
    id: str = ""

    @property
    def port(self) -> int:
        return self.server.port

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, socket_timeout=5, decode_responses=True)

    def call(self, *args: Any) -> Any:
        with self.client() as client:
            return client.execute_command(*args)

    def info(self) -> dict[str, str]:
        """``CLUSTER INFO`` as a dict."""
        text: str = self.call("CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in text.split() if ":" in line)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free for a node and for its cluster bus (the port + 10000), both below
    Linux's ephemeral range (32768-60999), where a client's outgoing connection could
    take either between this check and the node's bind."""
    for _ in range(200):
        port = random.randint(12_000, 22_767)
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise ClusterError("no free port pair for a cluster node")


def _slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """The 16384 slots in ``primaries`` contiguous ranges of (almost) equal size."""
    bounds = [SLOTS * i // primaries for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> float:
    """Poll ``check`` until it is true; the seconds it took. A node that refuses the
    connection meanwhile (being killed, starting) counts as not yet."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if check():
                return time.monotonic() - start
        except (redis.ConnectionError, redis.TimeoutError):
            pass
        time.sleep(0.02)
    raise ClusterError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """A Valkey Cluster of embedded servers on loopback (see the module docstring)."""

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        *,
        appendonly: bool = False,
    ) -> None:
        #: AOF on every node (``appendfsync always``): what ``durability="fsync"`` needs.
        self.appendonly = appendonly
        self.primaries_count = primaries
        self.replicas_count = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[Node] = []
        self._root: Path | None = None
        #: Seconds :meth:`start` took (the test reports note it).
        self.start_seconds = 0.0
        self._met_at = 0.0

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        began = time.monotonic()
        self._root = Path(tempfile.mkdtemp(prefix="toolq-cluster-"))
        try:
            total = self.primaries_count * (1 + self.replicas_count)
            for i in range(total):
                self._spawn(self._root / f"node{i}", free_port(), self.appendonly)
            primaries = self.nodes[: self.primaries_count]
            for node, (first, last) in zip(primaries, _slot_ranges(len(primaries)), strict=True):
                node.call("CLUSTER", "ADDSLOTSRANGE", first, last)
            for node in self.nodes[1:]:
                node.call("CLUSTER", "MEET", HOST, self.nodes[0].port)
            self._met_at = time.monotonic()
            wait_for("every node to know every other", self._known_or_met_again)
            replicas = self.nodes[self.primaries_count :]
            for i, node in enumerate(replicas):
                node.call("CLUSTER", "REPLICATE", primaries[i % len(primaries)].id)
            self.wait_ok()
            wait_for("the replicas to be in sync", self._replicas_synced)
            # A client maps replicas from CLUSTER SLOTS, which lists one only once the
            # node asked has heard of it (gossip; seen missing under load).
            wait_for("every node to list every replica", self._replicas_listed)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def convert(self, data_dir: Path, port: int) -> Self:
        """The start of a Cluster around a single server's data (docs/cells.md): node 0
        is that server, stopped before, started again on its ``data_dir`` and ``port``
        with ``cluster-enabled yes`` and its AOF (it claims the slots its keys are in);
        ``primaries - 1`` empty nodes beside it. No slot is assigned and no node met:
        that is ``toolq cells adopt``'s work (then :meth:`wait_ok`). No replicas."""
        self._root = Path(tempfile.mkdtemp(prefix="toolq-cluster-"))
        try:
            self._spawn(data_dir, port, appendonly=True)
            for i in range(1, self.primaries_count):
                self._spawn(self._root / f"node{i}", free_port(), self.appendonly)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node this cluster started (and nothing else); remove their files."""
        for node in self.nodes:
            node.server.stop(timeout=5.0)
        self.nodes = []
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        # ``with Cluster(...).convert(...)`` enters one started already
        return self if self.nodes else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- clients

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(HOST, n.port) for n in self.live()]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A ``RedisCluster`` client on the live nodes (close it)."""
        kwargs.setdefault("decode_responses", True)
        return RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    @contextmanager
    def connected(self, **kwargs: Any) -> Iterator[RedisCluster]:
        client = self.client(**kwargs)
        try:
            yield client
        finally:
            client.close()

    # ----------------------------------------------------------------- topology

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.server.running]

    def owner(self, slot: int, via: Node | None = None) -> Node:
        """The primary serving ``slot``, as ``via`` (default: any live node) sees it."""
        asker = via or self.live()[0]
        for first, last, primary, *_ in asker.call("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return self._by_port(int(primary[1]))
        raise ClusterError(f"no node serves slot {slot}")

    def primaries(self) -> list[Node]:
        """The live primaries."""
        return [n for n in self.live() if not self._primary_id(n)]

    def replicas_of(self, primary: Node) -> list[Node]:
        return [n for n in self.live() if self._primary_id(n) == primary.id]

    def wait_ok(self, timeout: float = 20.0) -> float:
        """Wait until every live node says ``cluster_state:ok`` and all agree on the
        owner of every slot; the seconds it took."""
        return wait_for("cluster_state:ok on every node", self._ok, timeout)

    # ----------------------------------------------------------------- chaos

    def kill_primary(self, slot: int, timeout: float = 20.0) -> tuple[Node, float]:
        """SIGKILL the primary of ``slot``; return it and the seconds until its replica
        served the slot on every live node's map."""
        victim = self.owner(slot)
        began = time.monotonic()
        victim.server.kill()
        wait_for(
            f"a replica to take over slot {slot}",
            lambda: all(self.owner(slot, via=n) is not victim for n in self.live()),
            timeout,
        )
        self.wait_ok(timeout)
        return victim, time.monotonic() - began

    def revive(self, node: Node, timeout: float = 20.0) -> None:
        """Start a killed node again (same port and nodes.conf): it rejoins as a replica."""
        node.server.start()
        wait_for(f"node {node.port} to rejoin", lambda: self._primary_id(node) != "", timeout)
        self.wait_ok(timeout)
        wait_for("the replicas to be in sync", self._replicas_synced, timeout)

    def migrate_slot(self, slot: int, target: Node, timeout: float = 20.0) -> float:
        """Move ``slot`` to primary ``target`` with atomic slot migration; the seconds it
        took until every live node routes the slot to ``target``."""
        source = self.owner(slot)
        if source is target:
            raise ValueError(f"slot {slot} is on {target.port} already")
        began = time.monotonic()
        source.call("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", target.id)
        wait_for(
            f"slot {slot} to reach {target.port}",
            lambda: all(self.owner(slot, via=n) is target for n in self.live()),
            timeout,
        )
        self.wait_ok(timeout)
        return time.monotonic() - began

    # ----------------------------------------------------------------- internals

    def _spawn(self, data_dir: Path, port: int, appendonly: bool) -> Node:
        """Start one cluster-enabled node (not yet in the cluster) and add it to :attr:`nodes`."""
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(self.node_timeout_ms),
            # A replica whose primary died a moment ago is fresh enough to take over.
            "cluster-replica-validity-factor": "0",
            # A revived node stays the replica of its own shard.
            "cluster-allow-replica-migration": "no",
            # A replica's first sync (and a revived one's) starts at once, not after
            # the default 5 s wait for more replicas to share the transfer.
            "repl-diskless-sync-delay": "0",
        }
        server = EmbeddedServer(
            data_dir, port=port, appendonly=appendonly, databases=1, extra_config=config
        )
        self.nodes.append(Node(server))
        server.start()
        self.nodes[-1].id = self.nodes[-1].call("CLUSTER", "MYID")
        return self.nodes[-1]

    def _by_port(self, port: int) -> Node:
        for node in self.nodes:
            if node.port == port:
                return node
        raise ClusterError(f"no node on port {port}")

    def _nodes_lines(self, node: Node) -> list[list[str]]:
        return [line.split() for line in node.call("CLUSTER", "NODES").splitlines()]

    def _primary_id(self, node: Node) -> str:
        """The id of ``node``'s primary ('' while it is a primary or unknown)."""
        for fields in self._nodes_lines(node):
            if "myself" in fields[2].split(","):
                return fields[3] if fields[3] != "-" else ""
        return ""

    def _all_known(self) -> bool:
        return not self._short_of_peers()

    def _short_of_peers(self) -> list[Node]:
        want = len(self.nodes)
        return [
            n
            for n in self.nodes
            if sum("handshake" not in f[2] for f in self._nodes_lines(n)) != want
        ]

    def _known_or_met_again(self) -> bool:
        """Every node knows every other; if not, every :data:`MEET_AGAIN_S` a node short
        of peers meets them all again. A node drops a handshake not answered within the
        node timeout and never retries it: on a loaded machine (two test processes on 2
        cores) one dropped handshake left a node out until the wait timed out."""
        short = self._short_of_peers()
        if not short:
            return True
        if time.monotonic() - self._met_at >= MEET_AGAIN_S:
            self._met_at = time.monotonic()
            for node in short:
                for other in self.nodes:
                    if other is not node:
                        node.call("CLUSTER", "MEET", HOST, other.port)
        return False

    def _ok(self) -> bool:
        live = self.live()
        if not all(n.info().get("cluster_state") == "ok" for n in live):
            return False
        maps = [sorted((s[0], s[1], s[2][1]) for s in n.call("CLUSTER", "SLOTS")) for n in live]
        return all(m == maps[0] for m in maps)

    def _replicas_listed(self) -> bool:
        want = 3 + self.replicas_count  # first, last, primary, then each replica
        return all(len(r) == want for n in self.live() for r in n.call("CLUSTER", "SLOTS"))

    def _replicas_synced(self) -> bool:
        for node in self.live():
            if self._primary_id(node):
                info = node.client().info("replication")
                if info.get("master_link_status") != "up":
                    return False
        return True
