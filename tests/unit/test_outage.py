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

from toolq import ToolQueue, errors
from toolq.outage import message, server_errors

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
        (redis.AuthenticationError("invalid password"), "check the password in TOOLQ_REDIS_URL"),
        (redis.BusyLoadingError("loading"), "loading its data after a restart"),
        (redis.TimeoutError("Timeout reading from socket"), "did not answer in time"),
        (redis.ConnectionError("Connection reset by peer"), "cannot reach the server"),
    ],
)
def test_each_failure_says_what_to_do(exc: Exception, says: str) -> None:
    text = message(f"redis://u:{SECRET}@cache:6379/2", exc)
    assert says in text and "cache:6379/2" in text and SECRET not in text


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
