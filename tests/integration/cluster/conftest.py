"""The Valkey Cluster fixture (tests/cluster.py): one cluster per test module; and
what the modules that run a deployment on it share (cells mode, outbox mode to a
plain Valkey database, real worker, scheduler and relay processes)."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from pydantic import SecretStr

from tests.cluster import HOST, Cluster
from tests.conftest import DatabasePool, _database_url
from tests.helpers import start_scheduler, start_toolq, start_worker, stop_processes
from tests.integration.apps import cells_app
from toolq import ToolQueue

#: The cells of the deployments these modules run (each primary serves some).
CELLS = 16


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three primaries with a replica each, started once for the module, stopped after it.

    A test that kills a node revives it before it ends, so the next test finds
    three primaries with a replica each again.
    """
    with Cluster(primaries=3, replicas=1) as started:
        yield started


@pytest.fixture(scope="module")
def broker_url(valkey: str, valkey_databases: DatabasePool) -> Iterator[str]:
    """Celery's broker, and the provider's store: a plain Valkey database."""
    yield from _database_url(valkey, valkey_databases)


@pytest.fixture
def provider(broker_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(broker_url)
    yield client
    client.close()


def node_url(cluster: Cluster) -> str:
    """The URL the deployment's processes start from (any node would do)."""
    return f"redis://{HOST}:{cluster.nodes[0].port}"


def cells_env(url: str, broker_url: str, durability: str = "none") -> dict[str, str]:
    """What every process of the deployment is started with."""
    return {
        "TOOLQ_CELLS": str(CELLS),
        "TOOLQ_CLUSTER": "1",
        "TOOLQ_DURABILITY": durability,
        "TOOLQ_REDIS_URL": url,
        "TOOLQ_BROKER_URL": broker_url,
        "PROVIDER_URL": broker_url,
    }


def cells_client(url: str, broker_url: str) -> ToolQueue:
    """The test's own client of the deployment (its submits are not waited on to disk)."""
    update = {
        "cells": CELLS,
        "cluster": True,
        "durability": "none",
        "redis_url": SecretStr(url),
        "broker_url": SecretStr(broker_url),
    }
    return cells_app.make(cells_app.SETTINGS.model_copy(update=update))


def start_relay(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return start_toolq(["relay", "--app", cells_app.APP, "--loglevel", "WARNING"], env=env)


def deployment(
    cluster: Cluster, broker_url: str, durability: str = "none", concurrency: int = 8
) -> Iterator[ToolQueue]:
    """A client of a deployment with a worker (threads), a scheduler and a relay of
    ``durability``, stopped when the generator ends (the test's own client submits
    with ``none``)."""
    url = node_url(cluster)
    env = cells_env(url, broker_url, durability)
    client = cells_client(url, broker_url)
    procs = [
        start_worker(cells_app.APP, url, env=env, concurrency=concurrency),
        start_scheduler(cells_app.APP, url, env=env),
        start_relay(env),
    ]
    yield client
    stop_processes(procs, timeout=5)
    client.close()


@pytest.fixture(scope="module")
def deployed(cluster: Cluster, broker_url: str) -> Iterator[ToolQueue]:
    """:func:`deployment` once for the module."""
    yield from deployment(cluster, broker_url)


def committed(provider: redis.Redis) -> Counter[str]:
    """Side effects the provider committed, per operation_ref."""
    return Counter(x.decode() for x in provider.lrange("provider:effects", 0, -1))
