"""Fixtures for the whole suite.

- ``valkey`` (session): the base URL of the real server every Redis test uses.
  ``TOOLQ_TEST_REDIS_URL`` names an existing server; otherwise one embedded
  Valkey is started for the session (AOF, ``appendfsync always``: the durability
  toolq runs with by default; 4096 databases) and stopped at
  its end. A server that cannot be started or reached is an error, never a
  skip: CI must not go green without having talked to Redis.
- ``redis_url`` (function) / ``module_redis_url`` (module): a URL on that
  server pointing at a database of its own, flushed before and after use.
- ``fake_redis`` (function): a fakeredis client with Lua, on a server of its own.

Order (``make test``: pytest-xdist, ``--dist loadfile``): the modules in SLOWEST go
first, in that order, then the rest as collected (contract, e2e, integration, unit),
and xdist keeps that order instead of handing out the modules with the most tests
first. By default it did: the unit modules (hundreds of quick tests) went first and
a one-test module of a minute (test_outage_chaos) could start last, leaving the other
process idle for its length.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import fakeredis
import pytest
import redis

from toolq.adapters.embedded import EmbeddedServer, RedactedUrl, url_for_db
from toolq.core.redact import redact_url

TEST_REDIS_URL_ENV = "TOOLQ_TEST_REDIS_URL"
#: The longest modules (seconds in a quiet 2-process run, 2026-12; ~: measured alone),
#: started first.
SLOWEST = (
    "tests/e2e/test_outage_chaos.py",  # 71 s
    "tests/e2e/test_readme_benches.py",  # ~61 s
    "tests/integration/test_deps.py",  # 53 s
    "tests/integration/test_broker_outage.py",  # 46 s
    "tests/e2e/test_chaos.py",  # 45 s
    "tests/e2e/test_peers_bench.py",  # 45 s
    "tests/e2e/test_limits_bench.py",  # 44 s
    "tests/integration/cluster/test_faults_on_cluster.py",  # 37 s
    "tests/e2e/test_noop_cost_benches.py",  # 36 s
    "tests/integration/test_server_outage.py",  # 32 s
    "tests/e2e/test_deploy_recipes.py",  # 30 s
    "tests/e2e/test_cluster_benches.py",  # ~22 s, a Cluster of its own
)
SESSION_DATABASES = 4096
# Database 0 is left alone: on a shared external server it may hold anything.
FIRST_TEST_DB = 1


class DatabasePool:
    """Hands out database numbers no other live fixture holds.

    Numbers are reused once released, so a suite longer than the pool still
    runs; a pool that runs dry means too many databases are held at once.
    """

    def __init__(self, numbers: range) -> None:
        self._free = list(reversed(numbers))
        self._size = len(numbers)
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(f"all {self._size} test databases are in use at once")
            return self._free.pop()

    def release(self, db: int) -> None:
        with self._lock:
            self._free.append(db)


def pytest_configure(config: pytest.Config) -> None:
    # --no-loadscope-reorder: xdist hands out the modules in the collection's order
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """SLOWEST's modules first, each whole and in its own order (a stable sort)."""
    rank = {path: i for i, path in enumerate(SLOWEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def _database_count(url: str) -> int:
    client = _client(url)
    try:
        client.ping()
        try:
            reply = client.config_get("databases")
        except redis.ResponseError:  # CONFIG disabled (managed servers): the default
            return 16
        value = reply.get("databases")
        return int(value) if value is not None else 16
    except redis.RedisError as exc:
        raise RuntimeError(
            f"the test Redis at {redact_url(url)} is not usable: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        client.close()


def _flush(url: str) -> None:
    client = _client(url)
    try:
        client.flushdb()
    finally:
        client.close()


def _worker_slice(first: int, count: int) -> range:
    """This pytest-xdist worker's share of an external server's databases."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or workers <= 1:
        return range(first, count)
    index = int(worker[2:])
    per_worker = (count - first) // workers
    if per_worker < 1:
        raise RuntimeError(f"{count} databases cannot be shared by {workers} xdist workers")
    start = first + index * per_worker
    return range(start, start + per_worker)


@pytest.fixture(scope="session")
def valkey() -> Iterator[str]:
    """Base URL (database 0) of the session's real Redis/Valkey server."""
    # RedactedUrl: pytest prints fixture values in failure reports; never a password.
    external = RedactedUrl(os.environ.get(TEST_REDIS_URL_ENV, ""))
    if external:
        _database_count(external)  # fail here, loudly, if it is not reachable
        yield external
        return
    # Each xdist worker process gets a server of its own, so no slicing is needed.
    # As deployed (toolq up, docker-compose.yml): claims and submits wait for the fsync.
    server = EmbeddedServer(databases=SESSION_DATABASES)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def valkey_databases(valkey: str) -> DatabasePool:
    """The pool of database numbers that ``redis_url`` fixtures draw from."""
    count = _database_count(valkey)
    if count <= FIRST_TEST_DB:
        raise RuntimeError(f"the test Redis has {count} database(s); toolq's tests need more")
    numbers = (
        _worker_slice(FIRST_TEST_DB, count)
        if os.environ.get(TEST_REDIS_URL_ENV)
        else range(FIRST_TEST_DB, count)
    )
    return DatabasePool(numbers)


def _database_url(valkey: str, pool: DatabasePool) -> Iterator[str]:
    db = pool.acquire()
    url = url_for_db(valkey, db)
    try:
        _flush(url)
        yield url
        _flush(url)
    finally:
        pool.release(db)


@pytest.fixture
def redis_url(valkey: str, valkey_databases: DatabasePool) -> Iterator[str]:
    """A URL to a flushed database that only this test uses."""
    yield from _database_url(valkey, valkey_databases)


@pytest.fixture(scope="module")
def module_redis_url(valkey: str, valkey_databases: DatabasePool) -> Iterator[str]:
    """A URL to a flushed database that only this module uses (workers started once)."""
    yield from _database_url(valkey, valkey_databases)


@pytest.fixture
def fake_redis() -> Iterator[fakeredis.FakeRedis]:
    """A fakeredis client (bytes replies, Lua via lupa) on a server no other test shares."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
    try:
        yield client
    finally:
        client.close()
