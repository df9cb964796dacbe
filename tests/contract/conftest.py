"""The ledger scripts' contract: every test here runs on fakeredis and on the real server.

fakeredis runs the Lua in lupa (Lua 5.1) and serves the unit tier; the real
server is what production runs. One suite on both keeps the unit tier honest.
Each ledger runs its scripts both ways: as functions of the loaded library
(FCALL, where the server has functions) and as plain scripts (EVALSHA, the
fallback for a server without them).
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


@pytest.fixture(params=("functions", "scripts"))
def ledger(client: redis.Redis, request: pytest.FixtureRequest) -> Ledger:
    ledger = Ledger(client, prefix="tq")
    if request.param == "scripts":
        ledger.scripts.functions = False  # as on a server that refused FUNCTION LOAD
    return ledger
