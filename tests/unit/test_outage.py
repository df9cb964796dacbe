"""An unreachable server is a toolq error that says where and what to do.

Every client method that talks to the server raises ``errors.ServerUnavailable``
(not redis-py's ConnectionError) naming the server with its password redacted;
the redis-py exception stays chained for logs. The server here is a loopback
port nothing listens on.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest
import redis
from pydantic import BaseModel
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    MasterDownError,
    MaxConnectionsError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
)

from toolq import ToolQueue
from toolq.adapters.outage import (
    TLS_ADVICE,
    UNREACHABLE,
    message,
    server_errors,
    tls_hint,
    unreachable,
)
from toolq.core import errors

SECRET = "s3cr3t-pw"


class Args(BaseModel):
    n: int = 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def tq() -> Any:
    q = ToolQueue(f"redis://:{SECRET}@127.0.0.1:{_closed_port()}/0")

    @q.tool
    def write(args: Args) -> dict[str, int]:
        return {}

    yield q
    q.close()


CALLS: dict[str, Callable[[ToolQueue], Any]] = {
    "submit": lambda q: q.submit("write", {"n": 1}),
    "call": lambda q: q.call("write", {"n": 1}, timeout=1),
    "get": lambda q: q.get("op-1"),
    "wait": lambda q: q.wait("op-1", timeout=1),
    "approve": lambda q: q.approve("op-1"),
    "provide_input": lambda q: q.provide_input("op-1", {"n": 2}),
    "cancel": lambda q: q.cancel("op-1"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_client_call_says_the_server_is_unreachable(tq: ToolQueue, name: str) -> None:
    with pytest.raises(errors.ServerUnavailable) as caught:
        CALLS[name](tq)
    exc = caught.value
    assert exc.code == "QUEUE_UNAVAILABLE"
    assert isinstance(exc, errors.RequestRefused)  # the tree callers already catch
    text = str(exc)
    assert "cannot reach the server at redis://" in text and ":***@127.0.0.1:" in text, text
    assert SECRET not in text
    assert "toolq up" in text and "TOOLQ_REDIS_URL" in text  # what to do
    assert isinstance(exc.__cause__, redis.ConnectionError)  # kept for logs


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (redis.AuthenticationError("invalid password"), "check the user and password in its URL"),
        (redis.BusyLoadingError("loading"), "loading its data after a restart"),
        (redis.TimeoutError("Timeout reading from socket"), "did not answer in time"),
        (redis.ConnectionError("Connection reset by peer"), "cannot reach the server"),
    ],
)
def test_each_failure_says_what_to_do(exc: Exception, says: str) -> None:
    text = message(f"redis://u:{SECRET}@cache:6379/2", exc)
    assert says in text and "cache:6379/2" in text and SECRET not in text


SSL_SAID = "Error 1 connecting to h:6380. [SSL: WRONG_VERSION_NUMBER] wrong version number."


@pytest.mark.parametrize(
    ("url", "exc", "hinted"),
    [
        # a TLS greeting to a plain server: a wait for the handshake, or a TLS error
        ("rediss://h:6380/0", redis.TimeoutError("Timeout connecting to server"), True),
        ("rediss://h:6380/0", redis.ConnectionError(SSL_SAID), True),
        # nothing listens there, TLS or not
        ("rediss://h:6380/0", redis.ConnectionError("Error 111 connecting to h:6380."), False),
        # connected: a server slow to answer a command, not a handshake
        ("rediss://h:6380/0", redis.TimeoutError("Timeout reading from h:6380"), False),
        ("redis://h:6380/0", redis.TimeoutError("Timeout connecting to server"), False),
        ("redis://h:6380/0", redis.ConnectionError(SSL_SAID), False),
        (None, redis.TimeoutError("Timeout connecting to server"), False),
    ],
)
def test_a_rediss_url_that_fails_its_handshake_is_told_to_check_tls(
    url: str | None, exc: Exception, hinted: bool
) -> None:
    assert (tls_hint(url, exc) == f"; {TLS_ADVICE}") is hinted
    assert (TLS_ADVICE in message(url or "", exc)) is hinted


def test_a_rediss_url_to_the_real_plain_server_says_tls(valkey: str) -> None:
    # Given the session's server, which serves no TLS, named by a rediss:// URL
    assert valkey.startswith("redis://")
    url = "rediss://" + valkey.removeprefix("redis://")
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=1, retry=None)
    # When a command goes: its TLS greeting is never answered (or is answered in plain)
    with pytest.raises(redis.RedisError) as caught:
        client.ping()
    client.close()
    # Then what toolq says of it names TLS, and the same server as redis:// answers
    assert TLS_ADVICE in message(url, caught.value), message(url, caught.value)
    with redis.Redis.from_url(valkey) as plain:
        assert plain.ping()


def test_a_server_answering_with_an_error_is_not_an_outage() -> None:
    class Client:
        app = type("A", (), {"redis_url": "redis://h/0"})()

        @server_errors
        def go(self) -> None:
            raise redis.ResponseError("WRONGTYPE Operation against a key")

    with pytest.raises(redis.ResponseError):
        Client().go()


def test_async_methods_are_translated_too() -> None:
    class Client:
        app = type("A", (), {"redis_url": f"redis://:{SECRET}@h:1/0"})()

        @server_errors
        async def go(self) -> None:
            raise redis.ConnectionError("Error 111 connecting to h:1. Connection refused.")

    with pytest.raises(errors.ServerUnavailable, match=r"redis://:\*\*\*@h:1/0"):
        asyncio.run(Client().go())


# ---------------------------------------------------------------- on a Cluster

SEEDS = f"redis://:{SECRET}@a:7000,b:7001,c:7002"


class _Node:
    """What redis-py's cluster clients attach as an exception's ``connection``: a
    connection or a ClusterNode, both with host and port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port


def _on(exc: Exception, host: str, port: int) -> Exception:
    exc.connection = _Node(host, port)  # type: ignore[attr-defined]
    return exc


def _raised_from(exc: Exception, cause: Exception) -> Exception:
    exc.__cause__ = cause
    return exc


def _no_seed() -> Exception:
    return _raised_from(
        RedisClusterException(
            "Redis Cluster cannot be connected. Please provide at least one reachable node: "
            "Error 111 connecting to c:7002. Connection refused."
        ),
        redis.ConnectionError("Error 111 connecting to c:7002. Connection refused."),
    )


# What redis-py's cluster clients raise with a node away, and what toolq says: the
# node that failed when redis-py tells which, else the seeds.
CLUSTER_TABLE: list[tuple[str, Exception, list[str]]] = [
    (
        "a node refuses connections (the connection redis-py attaches)",
        _on(redis.ConnectionError("Connection closed by server."), "d", 7003),
        ["cannot reach the Cluster's node d:7003", "its replica takes over"],
    ),
    (
        "a node refuses connections (the address in the connect error)",
        redis.ConnectionError("Error 111 connecting to e:7004. Connection refused."),
        ["cannot reach the Cluster's node e:7004"],
    ),
    (
        "raised while refreshing the map after a node's connection error",
        _raised_from(
            RedisClusterException("startup_nodes could not agree on a valid slots cache"),
            _on(redis.ConnectionError("Connection reset by peer"), "d", 7003),
        ),
        ["cannot reach the Cluster's node d:7003"],
    ),
    (
        "a node does not answer in time",
        _on(redis.TimeoutError("Timeout reading from socket"), "d", 7003),
        ["the Cluster's node d:7003 did not answer in time"],
    ),
    (
        "no seed answers",
        _no_seed(),
        ["cannot reach any seed node of the Cluster (a:7000, b:7001, c:7002)", "list more seeds"],
    ),
    (
        "the seeds are no Cluster's nodes",
        RedisClusterException(
            "Redis Cluster cannot be connected. Please provide at least one reachable node: "
            "Cluster mode is not enabled on this node"
        ),
        ["is not a Cluster node", "unset TOOLQ_CLUSTER"],
    ),
    (
        "CLUSTERDOWN (a live node answers it: it is not the one that failed)",
        _on(ClusterDownError("The cluster is down"), "a", 7000),
        ["a node of the Cluster (seeds a:7000, b:7001, c:7002) is down", "does not serve"],
    ),
    (
        "MASTERDOWN",
        MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'"),
        ["a node of the Cluster (seeds a:7000, b:7001, c:7002) is down"],
    ),
    (
        "a slot no node serves",
        SlotNotCoveredError('Slot "42" is not covered by the cluster.'),
        ["does not serve every slot"],
    ),
    (
        "not every slot covered after asking every seed",
        RedisClusterException("All slots are not covered after query all startup_nodes."),
        ["does not serve every slot"],
    ),
    (
        "too many redirections",
        ClusterError("TTL exhausted."),
        ["cannot reach a node of the Cluster (seeds a:7000, b:7001, c:7002)"],
    ),
    (
        "no free connection to a node",
        _on(MaxConnectionsError("Too many connections"), "d", 7003),
        ["no free connection to the Cluster's node d:7003"],
    ),
    (
        "a node refuses the password",
        _on(redis.AuthenticationError("invalid password"), "d", 7003),
        ["the Cluster's node d:7003 refused toolq's credentials"],
    ),
]


@pytest.mark.parametrize(
    ("exc", "says"), [row[1:] for row in CLUSTER_TABLE], ids=[row[0] for row in CLUSTER_TABLE]
)
def test_a_cluster_node_away_is_server_unavailable_naming_it(
    exc: Exception, says: list[str]
) -> None:
    class Client:
        app = type("A", (), {"redis_url": SEEDS, "settings": type("S", (), {"cluster": True})()})()

        @server_errors
        def go(self) -> None:
            raise exc

        @server_errors
        async def ago(self) -> None:
            raise exc

    for call in (Client().go, lambda: asyncio.run(Client().ago())):
        with pytest.raises(errors.ServerUnavailable) as caught:
            call()
        text = str(caught.value)
        assert all(s in text for s in says), text
        assert SECRET not in text
        assert caught.value.__cause__ is exc
        assert unreachable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        CrossSlotTransactionError("Cross-slot keys"),
        InvalidPipelineStack("pipeline stack is invalid"),
        redis.ResponseError("WRONGTYPE Operation against a key"),
        ReadOnlyError("You can't write against a read only replica."),
    ],
)
def test_a_cluster_answer_or_a_misuse_stays_as_it_is(exc: Exception) -> None:
    class Client:
        app = type("A", (), {"redis_url": SEEDS, "settings": type("S", (), {"cluster": True})()})()

        @server_errors
        def go(self) -> None:
            raise exc

    with pytest.raises(type(exc)):
        Client().go()
    assert not unreachable(exc)


def test_the_unreachable_tuple_covers_every_cluster_outage() -> None:
    # what long-running processes wait out (toolq.adapters.outage.UNREACHABLE)
    for _, exc, _ in CLUSTER_TABLE:
        assert isinstance(exc, UNREACHABLE), type(exc)
    assert issubclass(RedisClusterException, UNREACHABLE)
    assert not issubclass(RedisClusterException, redis.RedisError)  # why it is listed
