"""redis.asyncio's commands packed by hiredis (toolq.adapters.aio_packing): the same
bytes as redis-py's Python packer, the same error, and the pools that get it."""

from __future__ import annotations

from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from toolq.adapters.aio_packing import HiredisPacking, hiredis_packed, packed
from toolq.topology.nodes import OneServer

PYTHON = Connection()  # redis-py's own packer (never connected)


@pytest.mark.parametrize(
    "args",
    [
        ("FCALL", "claim", 3, "{toolq}:op:a", "{toolq}:idx", 1_764_680_000_000, "host:12:3"),
        ("FCALL", "apply", 1, "k", "é ünïcode", "", "with space", -7, 0),
        ("SET", "k", 2.5),  # a float as redis-py sends it
        ("SET", b"bytes", memoryview(b"view"), bytearray(b"array")),
        ("CONFIG GET", "appendonly"),  # a command name of two words: split
        (b"CLIENT SETNAME", b"toolq"),
        ("SET", "big", "x" * 100_000),  # past redis-py's chunking cutoff: joined all the same
    ],
)
def test_a_command_is_packed_as_redis_py_packs_it(args: tuple[Any, ...]) -> None:
    assert b"".join(packed(*args)) == b"".join(PYTHON.pack_command(*args))


@pytest.mark.parametrize("bad", [None, object(), ["a", "list"]])
def test_an_argument_it_cannot_send_raises_redis_pys_error(bad: Any) -> None:
    with pytest.raises(DataError):
        PYTHON.pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        packed("SET", "k", bad)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://localhost:6379/0", Connection),
        ("unix:///tmp/valkey.sock", UnixDomainSocketConnection),
    ],
)
def test_the_one_server_async_client_packs_with_hiredis(url: str, base: type) -> None:
    client = OneServer().async_client(url, {"max_connections": 2})
    cls = client.connection_pool.connection_class
    assert issubclass(cls, HiredisPacking) and issubclass(cls, base)
    assert hiredis_packed(client.connection_pool).connection_class is cls  # once


def test_a_pool_making_its_connections_by_a_function_is_left_as_it_is() -> None:
    """fakeredis's connection "class" is a function: nothing to mix into (the real
    server's pipelines through the packing: every claim and record of the asyncio pool's
    worker in tests/integration/test_aio_pool*.py)."""
    pool = aioredis.ConnectionPool(
        connection_class=fakeredis.aioredis.FakeConnection, server=fakeredis.FakeServer()
    )
    assert hiredis_packed(pool).connection_class is fakeredis.aioredis.FakeConnection
