"""LedgerCluster's own reading of a call's keys (no COMMAND GETKEYS round trip), and
AsyncLedgerCluster's (tq.aio)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolq.adapters.ledger.cluster import AsyncLedgerCluster, function_keys, stream_keys


@pytest.mark.parametrize(
    ("args", "keys"),
    [
        (("FCALL", "f", 2, "{a}:x", "{a}:y", "arg"), ["{a}:x", "{a}:y"]),
        ((b"fcall_ro", "f", 0, "arg"), []),
        (("GET", "k"), None),
        (("FCALL", "f"), None),
    ],
)
def test_function_keys(args: tuple[Any, ...], keys: list[Any] | None) -> None:
    assert function_keys(args) == keys


@pytest.mark.parametrize(
    ("args", "keys"),
    [
        (("XREADGROUP", b"GROUP", "g", "c", b"COUNT", 10, b"STREAMS", "s1", "s2", ">", ">"),
         ["s1", "s2"]),
        # a consumer named "streams" is not the keyword
        (("XREADGROUP", "GROUP", "g", "streams", "STREAMS", "s1", "0"), ["s1"]),
        ((b"XREAD", b"BLOCK", 100, b"STREAMS", "s", "$"), ["s"]),
        (("XREAD", "COUNT", 1), None),
        (("XADD", "s", "*", "f", "v"), None),
        ((), None),
    ],
)  # fmt: skip
def test_stream_keys(args: tuple[Any, ...], keys: list[Any] | None) -> None:
    assert stream_keys(args) == keys


def test_the_async_client_reads_declared_keys_without_a_server() -> None:
    async def body() -> list[Any]:
        client = AsyncLedgerCluster(host="127.0.0.1", port=1)  # nothing is sent here
        parser = client.commands_parser  # its command table is empty: never read
        return [
            await parser.get_keys("FCALL", "f", 2, "{a}:x", "{a}:y", "arg"),
            await parser.get_keys("XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"),
        ]

    assert asyncio.run(body()) == [["{a}:x", "{a}:y"], ["s"]]
