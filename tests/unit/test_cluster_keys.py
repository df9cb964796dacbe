"""LedgerCluster's own reading of a call's keys (no COMMAND GETKEYS round trip)."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.ledger.cluster import function_keys, stream_keys


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
