"""The ledger scripts' contract: every test here runs on fakeredis and on the real server.

fakeredis runs the Lua in lupa (Lua 5.1) and serves the unit tier; the real
server is what production runs. One suite on both keeps the unit tier honest.
Each ledger runs its scripts both ways: as functions of the loaded library
(FCALL, where the server has functions) and as plain scripts (EVALSHA, the
fallback for a server without them), and in each layout (:mod:`toolq.core.layout`):
the single tag, and cells, where every key is a cell's (``{tq:c000}:...``).
Outbox publishing joins it in test_outbox_scripts.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from toolq.adapters.ledger import Ledger
from toolq.core.layout import Cells, Layout, SingleTag

BACKENDS = ("fakeredis", "valkey")

#: One cell, so that every ref of a test is in it and the suite's reads of the
#: ledger's keys name that cell's (which cell a ref is in: tests/unit/test_cells.py).
LAYOUTS = {"single tag": SingleTag("tq"), "cells": Cells("tq", 1)}


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


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> Layout:
    return LAYOUTS[request.param]


@pytest.fixture(params=("functions", "scripts"))
def ledger(client: redis.Redis, layout: Layout, request: pytest.FixtureRequest) -> Ledger:
    ledger = Ledger(client, prefix=layout.prefix, cells=layout.cells)
    if layout.cells is not None:  # its own keys: the cell's, where every ref of a test is
        ledger = ledger.in_cell(0)
    if request.param == "scripts":
        ledger.scripts.functions = False  # as on a server that refused FUNCTION LOAD
    return ledger
