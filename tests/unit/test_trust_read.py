"""The console's trust read (toolq.edges.monitor.console.trust) on a server holding a
young system's samples: the window's sparse fields miss its first sample, which is read
too, so the figures count from it (fakeredis; the real stack's figures are
tests/integration/test_trust.py's)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import fakeredis
import fakeredis.aioredis

from toolq.core.settings import ToolqSettings
from toolq.edges.monitor.console import trust
from toolq.edges.monitor.read import settings_sources

NOW = 1_800_000_000_000  # a whole hour
M = 60_000


def sample(at: int, **pay: int) -> str:
    return json.dumps({"at": at, "read": at + 50, "tools": {"pay": pay}})


def test_a_young_systems_hour_counts_from_its_first_sample() -> None:
    server = fakeredis.FakeServer()
    sync = fakeredis.FakeRedis(server=server)
    settings = ToolqSettings()
    keys = settings_sources(settings).keys
    # Given a stack 2 minutes old: its first sample before 5 unknown outcomes, one after
    sync.hset(keys.series_tools, str(NOW - 2 * M), sample(NOW - 2 * M, submitted=1))
    sync.hset(keys.series_tools, str(NOW), sample(NOW, submitted=6, unknown=5))
    # and a sixth since, in the counters read live
    sync.hset(keys.stats, mapping={"pay|submitted": 7, "pay|unknown": 6})
    client = fakeredis.aioredis.FakeRedis(server=server)

    async def read() -> dict[str, Any]:
        async def connect() -> Any:
            return client

        aio = SimpleNamespace(
            app=SimpleNamespace(now_ms=lambda: NOW + 30_000, settings=settings), client=connect
        )
        return await trust(aio, "1h")  # type: ignore[arg-type]

    # When the console reads the hour's figures
    body = asyncio.run(read())

    # Then they count from the first sample: all 6, not the 1 since the later one
    assert body["since_ms"] == NOW - 2 * M + 50
    assert body["tools"]["pay"]["unknown"] == 6
    assert body["complete"] is False
