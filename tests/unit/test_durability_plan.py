"""The durability plan as a table: what toolq does on each server, and why.

:func:`toolq.adapters.ledger.durability.plan` decides from what the server said about its
append-only file (and, on a Cluster, whether the write's shard has a replica)
whether a claim and a submit wait for the fsync (WAITAOF) and for a replica
(WAIT), and what toolq warns about; :func:`check_ack` and :func:`check_replica`
read their answers; :func:`resend` reads a Cluster node's refusal. All pure.
The real server's side is tests/integration/test_durability.py, and
tests/integration/cluster/test_cluster_fsync.py on a Cluster.
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Sequence
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis

from toolq.adapters.ledger.durability import (
    AOF_OFF,
    NO_WAITAOF,
    NOT_ALWAYS,
    PROBE_EVERY_S,
    WAIT_REPLICA,
    WAITAOF,
    Persistence,
    Plan,
    check_ack,
    check_replica,
    plan,
)
from toolq.adapters.ledger.durable import (
    AsyncClusterNodes,
    AsyncDurability,
    ClusterNodes,
    Durability,
)
from toolq.adapters.ledger.route import Resend, Route, resend
from toolq.core import errors

SET = "redis.call('SET', KEYS[1], ARGV[1]) return 1"


class OneScript:
    """What Durability runs scripts through (toolq.adapters.ledger.runner.Scripts), with one
    script."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.sha = client.script_load(SET)

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return self.client.evalsha(self.sha, len(keys), *keys, *args)

    def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        return ["EVALSHA", self.sha, len(keys), *keys, *args]

    def load(self) -> None:
        self.sha = self.client.script_load(SET)


class AsyncOneScript:
    """The same on redis.asyncio (toolq.adapters.ledger.runner.AsyncScripts)."""

    def __init__(self, client: fakeredis.aioredis.FakeRedis) -> None:
        self.client = client
        self.script = client.register_script(SET)

    async def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return await self.script(keys=keys, args=args)

    async def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        return ["EVALSHA", self.script.sha, len(keys), *keys, *args]

    async def load(self) -> None:
        self.script.sha = await self.client.script_load(SET)


ALWAYS = Persistence(appendonly=True, appendfsync="always")
EVERYSEC = Persistence(appendonly=True, appendfsync="everysec")
UNSAID = Persistence()
#: The same servers as a Cluster shard whose primary has a replica.
ALWAYS_R = Persistence(True, "always", replicas=1)


@pytest.mark.parametrize(
    ("mode", "server", "expected"),
    [
        # durability=none never waits and never warns, whatever the server does
        ("none", ALWAYS, Plan(wait=False)),
        ("none", Persistence(appendonly=False), Plan(wait=False)),
        ("none", UNSAID, Plan(wait=False)),
        # appendfsync always: replies follow the fsync; WAITAOF costs nothing, so it is sent
        ("fsync", ALWAYS, Plan(wait=True)),
        # ... unless the server has none (Redis < 7.2): always alone holds the claim
        ("fsync", Persistence(True, "always", waitaof=False), Plan(wait=False)),
        # everysec / no: WAITAOF would cost ~100 ms and (Valkey 9.1) not fsync: warn instead
        ("fsync", EVERYSEC, Plan(wait=False, warning=NOT_ALWAYS)),
        ("fsync", Persistence(True, "no"), Plan(wait=False, warning=NOT_ALWAYS)),
        # AOF off: nothing survives a restart; WAITAOF would be an error
        ("fsync", Persistence(appendonly=False), Plan(wait=False, warning=AOF_OFF)),
        ("fsync", Persistence(False, "always"), Plan(wait=False, warning=AOF_OFF)),
        # CONFIG refused (managed servers): WAITAOF answers for the server
        ("fsync", UNSAID, Plan(wait=True)),
        # ... and a server that has no WAITAOF either cannot be checked
        ("fsync", Persistence(waitaof=False), Plan(wait=False, warning=NO_WAITAOF)),
        # A Cluster shard with a replica: a failover promotes it, so a replica must
        # have the write too (WAIT 1), in every case where anything is waited for
        ("fsync", ALWAYS_R, Plan(wait=True, replica=True)),
        ("fsync", Persistence(True, "always", replicas=2), Plan(wait=True, replica=True)),
        ("fsync", Persistence(replicas=1), Plan(wait=True, replica=True)),
        # ... and where the disk cannot be waited for: a failover is then what keeps
        # the write (the warning about the disk stays: a restart of the shard loses it)
        (
            "fsync",
            Persistence(appendonly=False, replicas=1),
            Plan(wait=False, warning=AOF_OFF, replica=True),
        ),
        (
            "fsync",
            Persistence(True, "everysec", replicas=1),
            Plan(wait=False, warning=NOT_ALWAYS, replica=True),
        ),
        # every server has WAIT, even one without WAITAOF
        (
            "fsync",
            Persistence(waitaof=False, replicas=1),
            Plan(wait=False, warning=NO_WAITAOF, replica=True),
        ),
        (
            "fsync",
            Persistence(True, "always", waitaof=False, replicas=1),
            Plan(wait=False, replica=True),
        ),
        # durability=none sends neither
        ("none", ALWAYS_R, Plan(wait=False)),
        ("none", Persistence(appendonly=False, replicas=1), Plan(wait=False)),
    ],
)
def test_plan(mode: str, server: Persistence, expected: Plan) -> None:
    assert plan(mode, server) == expected


@pytest.mark.parametrize(
    ("p", "waits"),
    [
        (Plan(wait=False), []),
        (Plan(wait=True), [WAITAOF]),
        (Plan(wait=False, replica=True), [WAIT_REPLICA]),
        # the disk first, then a replica: the answers are read in this order
        (Plan(wait=True, replica=True), [WAITAOF, WAIT_REPLICA]),
    ],
)
def test_what_follows_the_write(p: Plan, waits: list[tuple[Any, ...]]) -> None:
    assert p.waits() == waits
    assert WAIT_REPLICA[:2] == ("WAIT", 1)  # one replica: a failover promotes one


def test_a_replica_acknowledgement_is_one_replica() -> None:
    assert check_replica(1) is None
    assert check_replica(2) is None
    with pytest.raises(errors.NotDurable) as e:
        check_replica(0)  # WAIT timed out: no replica has the write
    assert e.value.code == "WRITE_NOT_DURABLE" and "replica" in str(e.value)
    with pytest.raises(redis.ResponseError, match="odd"):
        check_replica(redis.ResponseError("odd"))


MOVED = redis.exceptions.MovedError("3999 127.0.0.1:7001")
ASK = redis.exceptions.AskError("3999 127.0.0.1:7002")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        # it ran: read its answer (an error of the script itself is raised by the caller)
        (b"ok", None),
        ([1, 2], None),
        (redis.ResponseError("ERR wrong number of arguments"), None),
        # the slot is served elsewhere now (moved, failed over): read the map again
        (MOVED, Resend(remap=True)),
        # a primary that came back as a replica at the same address
        (
            redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
            Resend(remap=True),
        ),
        # the slot is being imported by another node: ask it, this once
        (ASK, Resend(ask=("127.0.0.1", 7002))),
        # a multi-key call while its slot is split by a migration: a moment later
        (redis.exceptions.TryAgainError("TRYAGAIN"), Resend(pause=0.05)),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN"), Resend(remap=True, pause=0.25)),
        # the node is gone (maybe after running it: every ledger call is a compare-and-set)
        (redis.ConnectionError("reset"), Resend(remap=True)),
        (redis.TimeoutError("timed out"), Resend(remap=True)),
        # ... but not this client's pool, full (tq.aio's cluster pool raises): not sent
        (redis.exceptions.MaxConnectionsError("too many"), None),
        # the node lost the scripts (restarted without persistence)
        (redis.exceptions.NoScriptError("NOSCRIPT"), Resend(load=True)),
        (redis.ResponseError("ERR Function not found"), Resend(load=True)),
    ],
)
def test_when_a_cluster_call_is_sent_again(reply: object, expected: Resend | None) -> None:
    assert resend(reply) == expected


def test_a_route_follows_an_ask_once_and_remaps_when_its_node_is_unknown() -> None:
    """The bookkeeping the sync and async Cluster calls share (:class:`Route`)."""
    importing = object()
    nodes = {("127.0.0.1", 7002): importing}
    cluster = types.SimpleNamespace(
        nodes_manager=types.SimpleNamespace(
            slots_cache={9: ["primary", "replica"]}, get_node=lambda h, p: nodes.get((h, p))
        )
    )
    route = Route(cluster, 9)
    assert route.shard() == ["primary", "replica"] and route.node == "primary"
    call, p = ("FCALL", "f", 1, "k"), Plan(wait=True)
    assert route.commands(call, p) == [call, WAITAOF]
    assert route.replies([1, 1]) == [1, 1]
    # an ASK to a node in the map: the next attempt goes there, ASKING first
    assert route.after(ASK, last=False) == Resend(ask=("127.0.0.1", 7002))
    route.shard()
    assert route.node is importing
    assert route.commands(call, p) == [("ASKING",), call, WAITAOF]
    assert route.replies(["OK", 1, 1]) == [1, 1]  # ASKING's own answer left out
    # it ran there: done, and the ASK was for that attempt only
    assert route.after(1, last=False) is None
    assert route.after(MOVED, last=False) == Resend(remap=True)
    assert route.shard() and route.node == "primary"
    # an ASK to a node the map does not know yet: read the map again
    nodes.clear()
    assert route.after(ASK, last=False) == Resend(ask=("127.0.0.1", 7002), remap=True)
    # the last attempt sends nothing again, whatever the answer
    assert route.after(MOVED, last=True) is None


def test_config_reply_is_read_as_the_server_spells_it() -> None:
    reply = {b"appendonly": b"yes", b"appendfsync": b"always", b"appenddirname": b"x"}
    assert Persistence.from_config(reply) == ALWAYS
    assert Persistence.from_config({"appendonly": "no"}) == Persistence(appendonly=False)
    assert Persistence.from_config({}) == UNSAID


def test_an_acknowledgement_is_one_local_fsync() -> None:
    assert check_ack([1, 0], ALWAYS) is None
    with pytest.raises(errors.NotDurable) as e:
        check_ack([0, 0], ALWAYS)
    # a ServerUnavailable: the caller may repeat the same call (same operation_ref)
    assert isinstance(e.value, errors.ServerUnavailable)
    assert e.value.code == "WRITE_NOT_DURABLE"


def test_what_an_error_teaches() -> None:
    off = redis.ResponseError(
        "WAITAOF cannot be used when numlocal is set but appendonly is disabled."
    )
    assert check_ack(off, UNSAID) == Persistence(appendonly=False)
    missing = redis.ResponseError("unknown command 'waitaof', with args beginning with:")
    assert check_ack(missing, UNSAID) == Persistence(waitaof=False)
    with pytest.raises(redis.ResponseError, match="something else"):
        check_ack(redis.ResponseError("something else"), UNSAID)


def test_a_server_without_config_or_waitaof_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given fakeredis: CONFIG and WAITAOF are both unknown commands
    client = fakeredis.FakeRedis()
    d = Durability(client, "fsync")
    run = OneScript(client)
    # When two writes go through it
    with caplog.at_level("WARNING", logger="toolq.durability"):
        assert d.call(run, "set", ["k"], ["v1"]) == 1
        assert d.call(run, "set", ["k"], ["v2"]) == 1
    # Then both were written, WAITAOF is not sent again, and one warning says why
    assert client.get("k") == b"v2"
    assert d.current() == Plan(wait=False, warning=NO_WAITAOF)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "has no WAITAOF" in warnings[0], warnings


def test_the_async_carrier_does_the_same(caplog: pytest.LogCaptureFixture) -> None:
    # tq.aio's submits go through AsyncDurability: the same plan, the same warning
    client = fakeredis.aioredis.FakeRedis()
    d = AsyncDurability(client, "fsync")
    run = AsyncOneScript(client)

    async def two_writes() -> list[Any]:
        return [await d.call(run, "set", ["k"], ["v1"]), await d.call(run, "set", ["k"], ["v2"])]

    with caplog.at_level("WARNING", logger="toolq.durability"):
        assert asyncio.run(two_writes()) == [1, 1]
    assert d.plans.current() == Plan(wait=False, warning=NO_WAITAOF)
    assert [r.getMessage() for r in caplog.records if "has no WAITAOF" in r.getMessage()]


class CountingCluster:
    """What a probe uses of a Cluster client. The first map refresh is held open until
    ``release`` is set, so other callers come while it runs."""

    def __init__(self) -> None:
        self.refreshes = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.nodes_manager = self

    def initialize(self) -> None:
        self.refreshes += 1
        if self.refreshes == 1:
            self.entered.set()
            assert self.release.wait(10)

    def get_default_node(self) -> str:
        return "node"

    def config_get(self, pattern: str, target_nodes: object = None) -> dict[str, str]:
        return {"appendonly": "yes", "appendfsync": "always"}


def test_one_thread_probes_at_the_minute_while_the_others_go_on() -> None:
    # Given a Cluster ledger's Durability whose settings were read once
    now = [0.0]
    cluster = CountingCluster()
    d = Durability(
        fakeredis.FakeRedis(), "fsync", clock=lambda: now[0], nodes=ClusterNodes(cluster)
    )
    d.probe()
    assert cluster.refreshes == 0  # the first probe reads the settings; the map is new
    # When the probe is due and one thread is refreshing the map
    now[0] = PROBE_EVERY_S
    first = threading.Thread(target=d.probe)
    first.start()
    assert cluster.entered.wait(10)
    # Then the others do not refresh it too (each refresh drops pooled connections):
    # they go on with the current plan
    for _ in range(5):
        assert d.current(replicas=1) == Plan(wait=True, replica=True)
    cluster.release.set()
    first.join(10)
    assert cluster.refreshes == 1
    # ... and the minute after, one probes again
    now[0] = 2 * PROBE_EVERY_S
    d.probe()
    d.probe()
    assert cluster.refreshes == 2


def test_a_probe_that_failed_is_taken_up_by_the_next_caller() -> None:
    now = [0.0]
    cluster = CountingCluster()
    cluster.release.set()
    d = Durability(
        fakeredis.FakeRedis(), "fsync", clock=lambda: now[0], nodes=ClusterNodes(cluster)
    )
    d.probe()
    now[0] = PROBE_EVERY_S
    lost = redis.ConnectionError("the node went away")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cluster, "config_get", lambda *a, **k: (_ for _ in ()).throw(lost))
        with pytest.raises(redis.ConnectionError):
            d.probe()
    d.probe()
    assert cluster.refreshes == 2


class AsyncCountingCluster:
    """The same on redis.asyncio (its own ``initialize``, a no-op once it ran, apart)."""

    def __init__(self) -> None:
        self.refreshes = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.nodes_manager = types.SimpleNamespace(initialize=self.refresh)

    async def initialize(self) -> None:
        pass

    async def refresh(self) -> None:
        self.refreshes += 1
        if self.refreshes == 1:
            self.entered.set()
            await self.release.wait()

    def get_default_node(self) -> str:
        return "node"

    async def config_get(self, pattern: str, target_nodes: object = None) -> dict[str, str]:
        return {"appendonly": "yes", "appendfsync": "always"}


def test_one_task_probes_at_the_minute_while_the_others_go_on() -> None:
    async def scenario() -> int:
        now = [0.0]
        cluster = AsyncCountingCluster()
        d = AsyncDurability(
            fakeredis.aioredis.FakeRedis(),
            "fsync",
            clock=lambda: now[0],
            nodes=AsyncClusterNodes(cluster),
        )
        await d.probe()
        now[0] = PROBE_EVERY_S
        first = asyncio.ensure_future(d.probe())
        await cluster.entered.wait()
        for _ in range(5):
            assert await d.current(replicas=1) == Plan(wait=True, replica=True)
        cluster.release.set()
        await first
        return cluster.refreshes

    assert asyncio.run(scenario()) == 1
