"""Subscribing to notice channels on ``redis.asyncio``: one server, or a Cluster.

As :mod:`toolq.adapters.notify.subscription`, on an event loop. On one server one
``PubSub`` read directly (:class:`AsyncSubscription`). On a Cluster
(:class:`AsyncShardedSubscription`) one connection per primary, each read by a
task of its own that hands what it hears to :meth:`get_message` (awaiting
several connections at once, without cancelling a read halfway through a reply).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisClusterException

from toolq.adapters.notify.placement import Placement


class AsyncSubscription:
    """``SSUBSCRIBE`` to notice channels on one server (``redis.asyncio``)."""

    def __init__(self, client: Any, channels: Sequence[str] = ()) -> None:
        self.client = client
        self.placement = Placement(channels)
        self._subs: dict[str, PubSub] = {}
        #: A Cluster's: each node's own pool and reader task (none on one server).
        self._pools: dict[str, aioredis.ConnectionPool] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._placing = asyncio.Lock()

    @property
    def channels(self) -> list[str]:
        return self.placement.channels

    async def add(self, *channels: str) -> None:
        """Subscribe to these too, now (or on a later :meth:`get_message`)."""
        if self.placement.add(*channels) and self._subs:  # a live subscription takes them
            await self._place()

    async def get_message(self, timeout: float) -> dict[str, Any] | None:
        """As :meth:`toolq.adapters.notify.Subscription.get_message`."""
        await self._place()
        if not self._subs:
            await asyncio.sleep(self.placement.idle(timeout, time.monotonic()))
            return None
        return await self._next(timeout)

    def nodes(self) -> set[str]:
        """As :meth:`toolq.adapters.notify.Subscription.nodes`."""
        return set(self._subs)

    async def aclose(self) -> None:
        for node in list(self._subs):
            await self._drop(node)

    async def _next(self, timeout: float) -> dict[str, Any] | None:
        sub = self._subs[""]
        try:
            msg = await sub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            await self._lost("")
            raise
        return None if msg is None else self.placement.moved(sub, msg)

    async def _place(self) -> None:
        async with self._placing:
            if self.placement.due(time.monotonic()):
                await self._place_homeless()

    async def _place_homeless(self) -> None:
        """(Under the placing lock.) One server: all at once."""
        sub = self._subs.get("")
        if sub is None:
            sub = self._subs[""] = self.client.pubsub()
        await self._subscribe("", sub, [list(self.placement.homeless)])

    async def _subscribe(self, node: str, sub: PubSub, batches: list[list[str]]) -> None:
        try:
            for batch in batches:
                await sub.ssubscribe(*batch)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            await self._lost(node)
            raise
        self.placement.placed(node, [c for batch in batches for c in batch])

    async def _lost(self, node: str) -> None:
        await self._drop(node)
        self.placement.lost(time.monotonic())

    async def _drop(self, node: str) -> None:
        sub = self._subs.pop(node, None)
        reader = self._readers.pop(node, None)
        pool = self._pools.pop(node, None)
        self.placement.unplace(node)
        if reader is not None:
            reader.cancel()
            await asyncio.wait([reader])  # its end; the caller's cancellation still raises
        with contextlib.suppress(Exception):  # closing a broken connection
            if sub is not None:
                await sub.aclose()  # type: ignore[no-untyped-call]
            if pool is not None:
                await pool.disconnect()


class AsyncShardedSubscription(AsyncSubscription):
    """``SSUBSCRIBE`` per node on a Cluster (``client``: redis.asyncio's ``RedisCluster``)."""

    def __init__(self, client: Any, channels: Sequence[str] = ()) -> None:
        super().__init__(client, channels)
        self._inbox: asyncio.Queue[tuple[str, PubSub, dict[str, Any] | BaseException]] = (
            asyncio.Queue()
        )

    async def _next(self, timeout: float) -> dict[str, Any] | None:
        timeout = self.placement.capped(timeout, time.monotonic())
        try:
            async with asyncio.timeout(timeout):
                node, sub, heard = await self._inbox.get()
        except TimeoutError:
            return None
        if self._subs.get(node) is not sub:
            return None  # from a connection dropped since
        if isinstance(heard, BaseException):
            await self._lost(node)
            raise redis.ConnectionError(f"notices of {node}: {heard}") from heard
        msg = self.placement.moved(sub, heard)
        if msg["type"] == "unsubscribe":
            # Its last channel moved away: close it and its reader (under the placing
            # lock: a channel being subscribed there meanwhile keeps it).
            async with self._placing:
                if self._subs.get(node) is sub and self.placement.deserted(node):
                    await self._drop(node)
        return msg

    async def _place_homeless(self) -> None:
        """(Under the placing lock.) On their owners, as the map says."""
        cluster = self.client
        try:
            await cluster.initialize()  # a new client's first map (then: nothing)
            if self.placement.stale:
                await cluster.nodes_manager.initialize()
            by_node = self.placement.by_owner(cluster)
        except (RedisClusterException, redis.RedisError, OSError) as exc:
            raise self.placement.unmapped(exc, time.monotonic()) from exc
        for name, channels in by_node.items():
            sub = self._subs.get(name)
            if sub is None:
                node = cluster.get_node(node_name=name)
                pool = self._pools[name] = aioredis.ConnectionPool(
                    connection_class=node.connection_class, **node.connection_kwargs
                )
                sub = self._subs[name] = PubSub(pool)
            await self._subscribe(name, sub, [[c] for c in channels])
            if name not in self._readers:  # once connected: a PubSub reads nothing before
                self._readers[name] = asyncio.get_running_loop().create_task(
                    self._read(name, sub), name=f"toolq-notices-{name}"
                )

    async def _read(self, node: str, sub: PubSub) -> None:
        """A node's reader: everything it hears, until its connection fails."""
        try:
            while True:
                msg = await sub.get_message(timeout=30.0)
                if msg is not None:
                    self._inbox.put_nowait((node, sub, msg))
        except Exception as exc:  # told to get_message, which raises
            self._inbox.put_nowait((node, sub, exc))
