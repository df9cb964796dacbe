"""The ledger scripts' contract: every test here runs on fakeredis and on the real server.

fakeredis runs the Lua in lupa (Lua 5.1) and serves the unit tier; the real
server is what production runs. One suite on both keeps the unit tier honest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from toolq.ledger import Ledger

BACKENDS = ("fakeredis", "valkey")


@pytest.fixture(params=BACKENDS)
def client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A client on an empty database: fakeredis, or a database of the real server."""
    if request.param == "fakeredis":
        yield request.getfixturevalue("fake_redis")
        return
    c = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def ledger(client: redis.Redis) -> Ledger:
    return Ledger(client, prefix="tq")
