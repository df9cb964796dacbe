"""Fixtures for the integration tier: the runtime app on a real server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.helpers import serving
from tests.integration.apps import agents_app, runtime_app
from toolq import ToolQueue

APP = "tests.integration.apps.runtime_app:tq"


@pytest.fixture(scope="module")
def rt(module_redis_url: str) -> Iterator[ToolQueue]:
    """The runtime app pointed at this module's database."""
    tq = runtime_app.tq
    tq.configure(redis_url=module_redis_url)
    yield tq
    tq.close()


@pytest.fixture(scope="module")
def agents_tq(module_redis_url: str) -> Iterator[ToolQueue]:
    """The agent-framework adapters' app (:mod:`tests.integration.apps.agents_app`) on
    this module's database, a worker and a scheduler running for the whole module."""
    with serving(agents_app.tq, agents_app.APP, module_redis_url) as tq:
        yield tq


@pytest.fixture
def provider(rt: ToolQueue) -> redis.Redis:
    return rt.redis


def effects(p: redis.Redis, ref: str) -> int:
    return sum(1 for r in p.lrange("provider:effects", 0, -1) if r.decode() == ref)


def seen(p: redis.Redis, ref: str) -> list[int]:
    return [int(x.decode().split(":")[0]) for x in p.lrange(f"provider:seen:{ref}", 0, -1)]
