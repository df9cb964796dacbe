"""The durability plan as a table: what toolq does on each server, and why.

:func:`toolq.ledger.durability.plan` decides from what the server said about its
append-only file whether a claim and a submit wait for the fsync (WAITAOF) and
what toolq warns about; :func:`check_ack` reads WAITAOF's answer. Both pure.
The real server's side is tests/integration/test_durability.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis

from toolq import errors
from toolq.ledger.durability import (
    AOF_OFF,
    NO_WAITAOF,
    NOT_ALWAYS,
    AsyncDurability,
    Durability,
    Persistence,
    Plan,
    check_ack,
    plan,
)

SET = "redis.call('SET', KEYS[1], ARGV[1]) return 1"


class OneScript:
    """What Durability runs scripts through (toolq.ledger.store.Scripts), with one script."""

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
    """The same on redis.asyncio (toolq.ledger.aio.AsyncScripts)."""

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
    ],
)
def test_plan(mode: str, server: Persistence, expected: Plan) -> None:
    assert plan(mode, server) == expected


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
