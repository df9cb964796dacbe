"""Subscribing to notice channels (sync): one server, or sharded over a Cluster.

The scripts ``SPUBLISH`` a cell's notices to a channel in the cell's slot, so on
a Cluster a notice stays on the node that ran the script (a classic ``PUBLISH``
is broadcast over the cluster bus to every node). :class:`ShardedSubscription`
therefore holds one connection per primary owning some of its channels, each
channel subscribed there by itself (one ``SSUBSCRIBE`` cannot span slots);
:class:`Subscription`, on one server, one connection and one ``SSUBSCRIBE`` of
them all. The caller picks the class (:mod:`toolq.topology.notices`).

:meth:`~Subscription.get_message` answers as redis-py's ``PubSub`` does, with the
sharded kinds renamed: ``"message"``, and ``"subscribe"`` for each confirmation.
A channel whose slot left its node (a slot migration sends ``sunsubscribe``, a
failover or a lost connection breaks it) is subscribed again on its owner,
looked up afresh, so the caller counts one confirmation more than it has
channels: notices published meanwhile are gone, waiters read again.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from toolq.adapters.notify.placement import Placement


class Subscription:
    """``SSUBSCRIBE`` to notice channels on one server: one connection (node "")."""

    def __init__(self, client: redis.Redis, channels: Sequence[str] = ()) -> None:
        self.client = client
        self.placement = Placement(channels)
        #: Node name ("" on one server) -> its connection.
        self._subs: dict[str, Any] = {}
        self._turn = 0

    @property
    def channels(self) -> list[str]:
        return self.placement.channels

    def add(self, *channels: str) -> None:
        """Subscribe to these too (on the next :meth:`get_message` if it fails now)."""
        self.placement.add(*channels)

    def get_message(self, timeout: float) -> dict[str, Any] | None:
        """The next message, waiting up to ``timeout`` s. Raises ``redis.ConnectionError``
        when a node could not be reached or refused a channel: those channels are
        subscribed again on a later call (the others are still heard)."""
        if self.placement.due(time.monotonic()):
            self._place()
        timeout = self.placement.capped(timeout, time.monotonic())
        deadline = time.monotonic() + timeout
        if not self._subs:  # nothing to hear, or nothing placed yet (a later call tries)
            time.sleep(self.placement.idle(timeout, time.monotonic()))
            return None
        if len(self._subs) == 1:
            ((node, sub),) = self._subs.items()
            return self._read(node, sub, timeout)
        while True:
            nodes = list(self._subs.items())
            self._turn = (self._turn + 1) % len(nodes)
            for node, sub in nodes[self._turn :] + nodes[: self._turn]:  # none starves
                msg = self._read(node, sub, 0.0)
                if msg is not None:
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # A plain select on the node connections' sockets: redis-py waits on one
            # connection at a time (what it buffered was drained just above).
            socks = [s.connection._sock for s in self._subs.values() if s.connection]
            select.select([s for s in socks if s is not None], [], [], left)

    def nodes(self) -> set[str]:
        """The nodes it holds a connection to ("" on one server)."""
        return set(self._subs)

    def close(self) -> None:
        for node in list(self._subs):
            self._drop(node)

    def _read(self, node: str, sub: Any, timeout: float) -> dict[str, Any] | None:
        try:
            msg: dict[str, Any] | None = sub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._lost(node)
            raise
        except redis.ResponseError as exc:  # MOVED, CROSSSLOT, CLUSTERDOWN: placed again
            self._lost(node)
            raise redis.ConnectionError(f"notices of {node or 'the server'}: {exc}") from exc
        if msg is None:
            return None
        msg = self.placement.moved(sub, msg)
        if msg["type"] == "unsubscribe":
            self._left(node)
        return msg

    def _left(self, node: str) -> None:
        """A channel's slot left ``node``: one server has no other node to go to."""

    def _place(self) -> None:
        """Subscribe the homeless channels (one server: all at once)."""
        sub = self._subs.get("")
        if sub is None:
            sub = self._subs[""] = self.client.pubsub()  # type: ignore[no-untyped-call]
        self._subscribe("", sub, [list(self.placement.homeless)])

    def _subscribe(self, node: str, sub: Any, batches: list[list[str]]) -> None:
        """``SSUBSCRIBE`` each batch on ``node``'s connection."""
        try:
            for batch in batches:
                sub.ssubscribe(*batch)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._lost(node)
            raise
        self.placement.placed(node, [c for batch in batches for c in batch])

    def _lost(self, node: str) -> None:
        """A node's connection failed: its channels wait to be placed again."""
        self._drop(node)
        self.placement.lost(time.monotonic())

    def _drop(self, node: str) -> None:
        sub = self._subs.pop(node, None)
        self.placement.unplace(node)
        if sub is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                sub.close()
                self._release(sub)

    def _release(self, sub: Any) -> None:
        """Let go of what ``sub``'s connection came from (one server: the client's pool)."""


class ShardedSubscription(Subscription):
    """``SSUBSCRIBE`` per node on a Cluster (``client`` a ``redis.cluster.RedisCluster``):
    one connection per primary owning some of the channels, each channel by itself."""

    def _left(self, node: str) -> None:
        if self.placement.deserted(node):
            self._drop(node)  # its last channel moved away: nothing to hear there

    def _place(self) -> None:
        """Subscribe the homeless channels on their owners, as the map says."""
        cluster: Any = self.client
        try:
            if self.placement.stale:
                cluster.nodes_manager.initialize()
            by_node = self.placement.by_owner(cluster)
        except (RedisClusterException, redis.RedisError, OSError) as exc:
            raise self.placement.unmapped(exc, time.monotonic()) from exc
        for node, channels in by_node.items():
            sub = self._subs.get(node)
            if sub is None:
                # A pool of its own: the cluster client marks its pools' connections
                # for reconnecting whenever it reads the map again (a subscription
                # would be dropped, and its notices lost, each time).
                shared = cluster.get_redis_connection(cluster.get_node(node_name=node))
                pool = redis.ConnectionPool(
                    connection_class=shared.connection_pool.connection_class,
                    **shared.connection_pool.connection_kwargs,
                )
                own = redis.Redis(connection_pool=pool)
                sub = self._subs[node] = own.pubsub()  # type: ignore[no-untyped-call]
            self._subscribe(node, sub, [[c] for c in channels])

    def _release(self, sub: Any) -> None:
        sub.connection_pool.disconnect()
