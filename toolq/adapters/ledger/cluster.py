"""The ledger on a Valkey/Redis Cluster: a RedisCluster that finds FCALL's keys itself.

redis-py finds the keys of ``EVAL``/``EVALSHA`` in the call, but those of any
command its table marks "movable keys", ``FCALL`` among them, by sending the
whole call (arguments included) to the cluster's *default node* as ``COMMAND
GETKEYS`` first. For the ledger that is one more round trip and one more
command per script call, every one of them on that one node, and, worse, sent
outside the client's retry loop: with the default node dead (a primary
SIGKILLed, before the client refreshed its map) every FCALL failed with a
connection error, whichever node its cell was on (tests/integration/cluster).
Pipelines ask the same way.

:class:`LedgerCluster` reads the keys of ``FCALL`` and ``FCALL_RO`` from the
call itself (``FCALL name numkeys key...``), direct calls and pipelined ones,
as redis-py does for ``EVALSHA``. The ledger always declares every key a
script touches (:mod:`toolq.adapters.ledger.scripts`), all under one cell's tag. The
same for ``XREAD``/``XREADGROUP`` (also "movable keys"), which the relay sends
for every cell's outbox: ~7 GETKEYS per call on the default node before
(``python -m bench.cluster_bench``: that node 0.40-0.42 of the cluster's server
CPU with 3 primaries, its cells' share 0.36; 0.35-0.36 with them read here).

:class:`AsyncLedgerCluster` is the same for ``tq.aio``: redis.asyncio's cluster
client asks the same way (``_determine_slot`` -> ``AsyncCommandsParser.get_keys``
-> ``COMMAND GETKEYS``), its pipelines through the client's parser too.

Both also refresh their map of the cluster when a node it takes for a primary
answers READONLY, and send the command again, once. redis-py refreshes the map
on a connection error or a MOVED, but a command sent to every primary (``FUNCTION
LOAD``: what a process's first ledger call does) gets neither from a primary that
failed over and came back as a replica, at the same address: it answers "You
can't write against a read only replica", and a client whose map predates the
failover (a prefork pool child: its parent read the map before it forked) failed
every call that way until restarted (``python -m bench.cluster_chaos``). The
refusal means the command did not run there, and what is sent to every primary
(``FUNCTION LOAD ... REPLACE``, ``SCRIPT LOAD``) may run twice.

redis.asyncio's cluster client raises ``MaxConnectionsError`` when a node has no
free connection, rather than waiting for one: :class:`AsyncLedgerCluster` given an
:class:`InFlight` (``tq.aio`` on a Cluster) sends every command and pipeline in a
turn of it, the ledger's, lists', views' and liveness reads' alike, so past the
bound they wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

from redis._parsers import AsyncCommandsParser, CommandsParser
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ReadOnlyError

from toolq.core.settings import seed_nodes, seed_urls

_FUNCTION_CALLS = frozenset({"FCALL", "FCALL_RO"})
_STREAM_READS = frozenset({"XREAD", "XREADGROUP"})


def _word(arg: Any) -> str:
    return (arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)).upper()


def function_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The keys a function call declares (``FCALL name numkeys key ... arg ...``);
    None for any other command."""
    if len(args) < 3 or _word(args[0]) not in _FUNCTION_CALLS:
        return None
    return list(args[3 : 3 + int(args[2])])


def stream_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The streams an XREAD/XREADGROUP reads (``... STREAMS key ... id ...``); None for
    any other command, or one without STREAMS. redis-py spells its keywords as bytes."""
    name = _word(args[0]) if args else ""
    if name not in _STREAM_READS:
        return None
    start = 4 if name == "XREADGROUP" else 1  # past GROUP group consumer ("streams" is a name)
    words = [_word(a) for a in args]
    if "STREAMS" not in words[start:]:
        return None
    rest = args[words.index("STREAMS", start) + 1 :]
    return list(rest[: len(rest) // 2])


def declared_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The keys of a call that declares them (FCALL, XREAD...); None for any other."""
    keys = function_keys(args)
    return stream_keys(args) if keys is None else keys


class _FunctionKeysParser(CommandsParser):
    """redis-py's parser, sharing its command table, that needs no server for FCALL."""

    def __init__(self, parser: CommandsParser) -> None:  # no COMMAND round trip again
        self.commands = parser.commands
        self.redis_connection = parser.redis_connection

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        keys = declared_keys(args)
        if keys is not None:
            return keys
        return super().get_keys(redis_conn, *args)  # type: ignore[no-untyped-call]


class _AsyncFunctionKeysParser(AsyncCommandsParser):
    """The same for redis.asyncio (its table is read by the client's ``initialize``)."""

    async def get_keys(self, *args: Any) -> Any:
        keys = declared_keys(args)
        if keys is not None:
            return keys
        return await super().get_keys(*args)


class LedgerCluster(RedisCluster):
    """``RedisCluster`` that reads a function call's keys from the call (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Pipelines get the client's parser (RedisCluster.pipeline), so they ask no more.
        self.commands_parser = _FunctionKeysParser(self.commands_parser)

    @classmethod
    def from_seeds(cls, url: str, **options: Any) -> LedgerCluster:
        """A client from every seed ``url`` lists, tried in its order (the credentials,
        TLS and options of the first apply to all): any one that answers will do."""
        nodes = [ClusterNode(host, port) for host, port in seed_nodes(url)]  # type: ignore[no-untyped-call]
        client: Any = cls.from_url(seed_urls(url)[0], startup_nodes=nodes, **options)
        return client  # type: ignore[no-any-return]

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except ReadOnlyError:  # a "primary" is a replica now: the map is stale (see above)
            self.nodes_manager.initialize()
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]


#: The :class:`InFlight` whose turn the current task holds (None: none).
_HELD: contextvars.ContextVar[InFlight | None] = contextvars.ContextVar(
    "toolq_in_flight", default=None
)


class InFlight:
    """At most ``limit`` commands out at once on one event loop; the others wait for
    a turn, in the order they came. A task that holds a turn takes no second one
    (the ledger holds one around a script call and its waits, which it sends through
    the client that takes turns too)."""

    def __init__(self, limit: int) -> None:
        self._turns = asyncio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        if _HELD.get() is self:
            yield
            return
        async with self._turns:
            token = _HELD.set(self)
            try:
                yield
            finally:
                _HELD.reset(token)


class AsyncLedgerCluster(AsyncRedisCluster):
    """redis.asyncio's ``RedisCluster`` that reads a function call's keys from the call,
    and sends in turns of :attr:`in_flight` when given one."""

    #: Every command and pipeline waits for a turn of it (None: no bound).
    in_flight: InFlight | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Before the first command: initialize() fills its table from COMMAND, as
        # it would redis-py's own; ClusterPipeline asks the client's parser.
        self.commands_parser = _AsyncFunctionKeysParser()

    @classmethod
    def from_seeds(cls, url: str, **options: Any) -> AsyncLedgerCluster:
        """:meth:`LedgerCluster.from_seeds` for redis.asyncio."""
        nodes = [AsyncClusterNode(host, port) for host, port in seed_nodes(url)]
        client: Any = cls.from_url(seed_urls(url)[0], startup_nodes=nodes, **options)
        return client  # type: ignore[no-any-return]

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with _turn(self.in_flight):
            try:
                return await super().execute_command(*args, **kwargs)
            except ReadOnlyError:  # a "primary" is a replica now: the map is stale (see above)
                await self.nodes_manager.initialize()
                return await super().execute_command(*args, **kwargs)

    async def aclose(self) -> None:
        await super().aclose()
        # redis-py's closes nothing while a connection error has left the client marked
        # for initializing again (its ``_initialize``): the live nodes' sockets leaked.
        await self.nodes_manager.aclose()
        await self.nodes_manager.aclose("startup_nodes")

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:  # as redis-py's: refused
            return super().pipeline(transaction, shard_hint)
        return _TurnPipeline(self, transaction)  # type: ignore[abstract]


class _TurnPipeline(ClusterPipeline):
    """A pipeline of :class:`AsyncLedgerCluster`: sent in a turn of its ``in_flight``."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client: Any = self.cluster_client
        async with _turn(client.in_flight):
            return await super().execute(raise_on_error, allow_redirections)


def _turn(in_flight: InFlight | None) -> contextlib.AbstractAsyncContextManager[None]:
    return contextlib.nullcontext() if in_flight is None else in_flight.turn()
