"""Carrying out the durability plan (:mod:`toolq.adapters.ledger.durability`): one core, two shells.

The core (:mod:`toolq.adapters.ledger.steps`) decides every step of a durable call and
yields what to do; :class:`Durability` (threads, ``redis``) and
:class:`AsyncDurability` (``redis.asyncio``, ``tq.aio``) only carry the effects out.

How a client reaches its server is a strategy the caller passes (the topology
picks it: :mod:`toolq.topology.ledger`): :class:`OneServer` or :class:`ClusterNodes`
(and their async twins), each with its core, its way to send and to probe.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import PipelineCommand
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from toolq.adapters.ledger.durability import Persistence, Plan, Plans
from toolq.adapters.ledger.steps import (
    Command,
    Direct,
    Effect,
    Load,
    Pause,
    Probe,
    Remap,
    Send,
    Steps,
    cluster_call,
    one_server_call,
)

# ----------------------------------------------------------------------------- runners


class Runner(Protocol):
    """Runs the ledger's scripts (:class:`toolq.adapters.ledger.runner.Scripts`)."""

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any: ...

    def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]: ...

    def load(self) -> None: ...


class AsyncRunner(Protocol):
    """The same on ``redis.asyncio`` (:class:`toolq.adapters.ledger.runner.AsyncScripts`)."""

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Awaitable[Any]: ...

    async def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]: ...

    async def load(self) -> None: ...


# ----------------------------------------------------------------------------- sync shell


class OneServer:
    """A client of one server: a call and its wait on a pipeline of the client."""

    #: FUNCTION LOAD without REPLACE (:class:`toolq.adapters.ledger.runner.ScriptWay`).
    replace_library = False

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def steps(self, plans: Plans, keys: Sequence[Any]) -> Steps:
        return one_server_call(plans)

    def send(self, commands: Sequence[tuple[Any, ...]], node: Any) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return pipe.execute(raise_on_error=False)

    def remap(self) -> None:
        pass

    def persistence(self, known: bool) -> Persistence:
        return _persistence(self.client.config_get, "append*")


class ClusterNodes:
    """A Cluster client: the call and its waits go to the call's node itself."""

    #: FUNCTION LOAD with REPLACE: it reaches every primary (ScriptWay).
    replace_library = True

    def __init__(self, client: Any) -> None:
        self.client = client

    def steps(self, plans: Plans, keys: Sequence[Any]) -> Steps:
        return cluster_call(plans, self.client, keys)

    def send(self, commands: Sequence[tuple[Any, ...]], node: Any) -> Any:
        pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        try:
            return pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return exc

    def remap(self) -> None:
        self.client.nodes_manager.initialize()

    def persistence(self, known: bool) -> Persistence:
        """One node's settings, taken to speak for all (they are deployed alike), and
        the map again (a replica back or added is waited for within a probe)."""
        if known:
            self.client.nodes_manager.initialize()
        node = self.client.get_default_node()
        return _persistence(functools.partial(self.client.config_get, target_nodes=node), "append*")


class Nodes(Protocol):
    """How a sync client reaches its server (:class:`OneServer`, :class:`ClusterNodes`)."""

    replace_library: bool

    def steps(self, plans: Plans, keys: Sequence[Any]) -> Steps: ...

    def send(self, commands: Sequence[tuple[Any, ...]], node: Any) -> Any: ...

    def remap(self) -> None: ...

    def persistence(self, known: bool) -> Persistence: ...


def nodes_of(client: redis.Redis) -> Nodes:
    """The strategy for a client built without one (tests, tools): as its class says."""
    return ClusterNodes(client) if isinstance(client, RedisCluster) else OneServer(client)


class Durability:
    """Carries out :func:`toolq.adapters.ledger.durability.plan` for one client. Thread-safe;
    one per ledger."""

    def __init__(
        self,
        client: redis.Redis,
        mode: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        nodes: Nodes | None = None,
    ) -> None:
        self.client = client
        self.nodes = nodes_of(client) if nodes is None else nodes
        self.plans = Plans(mode, where(client), clock)

    def current(self, replicas: int = 0) -> Plan:
        """The plan for the next write on a shard with ``replicas`` replicas."""
        self.probe()
        return self.plans.current(replicas)

    def probe(self) -> None:
        """Read the server's settings when due."""
        if not self.plans.begin():
            return
        try:
            self.plans.probed(self.nodes.persistence(self.plans.known()))
        finally:
            self.plans.ended()

    def call(self, run: Runner, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run script ``name``; with a waiting plan, WAITAOF (and on a Cluster shard
        with a replica, WAIT) in the same round trip, on the same connection."""
        steps = self.nodes.steps(self.plans, keys)
        answer: Any = None
        while True:
            try:
                effect = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = self._do(effect, run, name, keys, args)

    def _do(
        self, effect: Effect, run: Runner, name: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        match effect:
            case Direct():
                return run(name, keys, args)
            case Command():
                return run.command(name, keys, args)
            case Send(commands, node):
                return self.nodes.send(commands, node)
            case Load():
                run.load()
            case Remap():
                self.nodes.remap()
            case Pause(seconds):
                time.sleep(seconds)
            case Probe():
                self.probe()
        return None


# ----------------------------------------------------------------------------- async shell


class AsyncOneServer:
    """:class:`OneServer` on ``redis.asyncio``."""

    replace_library = False

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    def steps(self, plans: Plans, keys: Sequence[Any]) -> Steps:
        return one_server_call(plans)

    async def ready(self) -> None:
        pass

    async def send(self, commands: Sequence[tuple[Any, ...]], node: Any) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return await pipe.execute(raise_on_error=False)

    async def remap(self) -> None:
        pass

    async def persistence(self, known: bool) -> Persistence:
        try:
            return Persistence.from_config(await self.client.config_get("append*"))
        except redis.ResponseError:
            return Persistence()


class AsyncClusterNodes:
    """:class:`ClusterNodes` on ``redis.asyncio``: on the node's own connections."""

    replace_library = True

    def __init__(self, client: Any) -> None:
        self.client = client

    def steps(self, plans: Plans, keys: Sequence[Any]) -> Steps:
        return cluster_call(plans, self.client, keys)

    async def ready(self) -> None:
        await self.client.initialize()  # the map is there once it ran (then a no-op)

    async def send(self, commands: Sequence[tuple[Any, ...]], node: Any) -> Any:
        sent = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
        try:
            await node.execute_pipeline(sent)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return exc
        return [c.result for c in sent]

    async def remap(self) -> None:
        await self.client.nodes_manager.initialize()

    async def persistence(self, known: bool) -> Persistence:
        """As :meth:`ClusterNodes.persistence`."""
        if known:
            await self.client.nodes_manager.initialize()
        try:
            await self.ready()  # the default node is known once it ran
            node = self.client.get_default_node()
            return Persistence.from_config(
                await self.client.config_get("append*", target_nodes=node)
            )
        except redis.ResponseError:
            return Persistence()


class AsyncNodes(Protocol):
    """How an async client reaches its server."""

    replace_library: bool

    def steps(self, plans: Plans, keys: Sequence[Any]) -> Steps: ...

    async def ready(self) -> None: ...

    async def send(self, commands: Sequence[tuple[Any, ...]], node: Any) -> Any: ...

    async def remap(self) -> None: ...

    async def persistence(self, known: bool) -> Persistence: ...


def async_nodes_of(client: aioredis.Redis) -> AsyncNodes:
    """:func:`nodes_of` for redis.asyncio."""
    if isinstance(client, AsyncRedisCluster):
        return AsyncClusterNodes(client)
    return AsyncOneServer(client)


class AsyncDurability:
    """:class:`Durability` for a ``redis.asyncio`` client (``tq.aio``'s submits)."""

    def __init__(
        self,
        client: aioredis.Redis,
        mode: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        nodes: AsyncNodes | None = None,
    ) -> None:
        self.client = client
        self.nodes = async_nodes_of(client) if nodes is None else nodes
        self.plans = Plans(mode, where(client), clock)

    async def current(self, replicas: int = 0) -> Plan:
        await self.probe()
        return self.plans.current(replicas)

    async def probe(self) -> None:
        """As :meth:`Durability.probe`."""
        if not self.plans.begin():
            return
        try:
            self.plans.probed(await self.nodes.persistence(self.plans.known()))
        finally:
            self.plans.ended()

    async def call(
        self, run: AsyncRunner, name: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        steps = self.nodes.steps(self.plans, keys)
        answer: Any = None
        while True:
            try:
                effect = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = await self._do(effect, run, name, keys, args)

    async def _do(
        self, effect: Effect, run: AsyncRunner, name: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        match effect:
            case Direct():
                return await run(name, keys, args)
            case Command():
                return await run.command(name, keys, args)
            case Send(commands, node):
                return await self.nodes.send(commands, node)
            case Load():
                await run.load()
            case Remap():
                await self.nodes.remap()
            case Pause(seconds):
                await asyncio.sleep(seconds)
            case Probe():
                await self.nodes.ready()
                await self.probe()
        return None


def _persistence(config_get: Callable[[str], Any], pattern: str) -> Persistence:
    try:
        return Persistence.from_config(config_get(pattern))
    except redis.ResponseError:  # CONFIG renamed or refused: the server will not say
        return Persistence()


def where(client: redis.Redis | aioredis.Redis) -> str:
    """The server a client talks to, for messages: host:port/db or the socket (no password);
    ``cluster`` for a Cluster client (it has a pool per node, none of its own)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return "cluster"
    kw = pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
