"""How a client reaches the ledger's server: one server, or a Valkey/Redis Cluster.

One class per mode behind :class:`Nodes`; the topology picks one
(:func:`toolq.topology.choose.topology_for`), the App asks it for its clients.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any

import redis
import redis.asyncio as aioredis

from toolq.adapters.aio_packing import hiredis_packed
from toolq.adapters.ledger.cluster import AsyncLedgerCluster, InFlight, LedgerCluster
from toolq.topology.notices import CLUSTER, ONE_SERVER, Notices


class Nodes(ABC):
    """Builds and closes the ledger's clients (sync, and ``redis.asyncio`` for tq.aio)."""

    #: A Cluster: what error messages and the recorded mode name (no behaviour hangs on it).
    on_cluster: bool = False
    #: How this mode hears notices (:mod:`toolq.topology.notices`).
    notices: Notices = ONE_SERVER

    @abstractmethod
    def client(self, url: str, options: dict[str, Any]) -> redis.Redis:
        """The sync client of ``url``, pooled by ``options`` (redis-py's pool options)."""

    @abstractmethod
    def async_client(self, url: str, options: dict[str, Any]) -> aioredis.Redis:
        """The ``redis.asyncio`` client of ``url`` (one per event loop: not kept)."""

    def close(self, client: redis.Redis) -> None:
        """Close ``client`` and its pool's sockets."""
        client.close()

    async def aclose(self, client: aioredis.Redis) -> None:
        """Close an async client and its pool's sockets (a server away: closed anyway)."""
        with contextlib.suppress(Exception):
            await client.aclose()

    def bound(self, client: aioredis.Redis, in_flight: int) -> InFlight | None:
        """What bounds the commands in flight on ``client`` (``in_flight`` at most), where
        its pool does not wait for a free connection; None: its pool waits."""
        return None


class OneServer(Nodes):
    """One server: blocking pools, so that past ``max_connections`` a caller waits for a
    free connection instead of failing with "Too many connections"."""

    def client(self, url: str, options: dict[str, Any]) -> redis.Redis:
        pool = redis.BlockingConnectionPool.from_url(url, **options)
        return redis.Redis(connection_pool=pool)

    def async_client(self, url: str, options: dict[str, Any]) -> aioredis.Redis:
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        return aioredis.Redis(connection_pool=hiredis_packed(pool))

    def close(self, client: redis.Redis) -> None:
        # Redis(connection_pool=...).close() leaves the pool's sockets open.
        client.close()
        client.connection_pool.disconnect()

    async def aclose(self, client: aioredis.Redis) -> None:
        await super().aclose(client)
        await client.connection_pool.disconnect()


class ClusterNodes(Nodes):
    """A Cluster, reached from the URL of any of its nodes, or of several
    (``redis://a:7000,b:7001``: it starts from any that answers); the client finds the
    node of each call's cell itself, FCALLs included (:class:`LedgerCluster`). Typed as
    the Redis client: toolq sends it the same commands.

    The async client's ``max_connections`` is per node, and a node out of connections
    raises ``MaxConnectionsError`` rather than waiting for one (redis.asyncio's cluster
    pool does not block): ``tq.aio`` bounds its commands in flight below it."""

    on_cluster = True
    notices = CLUSTER

    def client(self, url: str, options: dict[str, Any]) -> redis.Redis:
        client: Any = LedgerCluster.from_seeds(url, **_no_pool_timeout(options))
        return client  # type: ignore[no-any-return]

    def async_client(self, url: str, options: dict[str, Any]) -> aioredis.Redis:
        client: Any = AsyncLedgerCluster.from_seeds(url, **_no_pool_timeout(options))
        return client  # type: ignore[no-any-return]

    # close(), aclose(): a cluster client closes its nodes' pools itself.

    def bound(self, client: aioredis.Redis, in_flight: int) -> InFlight:
        # A node out of connections raises: every command of the client, the ledger's
        # and the reads outside it (liveness, lists, views), waits for a turn of this.
        bound = InFlight(in_flight)
        client.in_flight = bound  # type: ignore[attr-defined]
        return bound


def _no_pool_timeout(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "timeout"}  # no blocking pool here
