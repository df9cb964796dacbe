"""The peers bench's toolq variant (``BENCH_TOOLQ_POOL``): parsed as a table."""

from __future__ import annotations

import pytest

from bench.peers.toolq_peer import Adapter, pool_of


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ("prefork", 2)),
        ("", ("prefork", 2)),
        ("asyncio:16", ("asyncio", 16)),
        ("threads:8", ("threads", 8)),
    ],
)
def test_pool_of_reads_pool_and_concurrency(value: str | None, expected: tuple[str, int]) -> None:
    assert pool_of(value) == expected


@pytest.mark.parametrize("value", ["asyncio", "asyncio:", ":4", "asyncio:0", "asyncio:x"])
def test_pool_of_refuses_what_is_not_pool_colon_count(value: str) -> None:
    with pytest.raises(ValueError, match="pool:concurrency"):
        pool_of(value)


def test_the_variant_says_it_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_TOOLQ_POOL", "asyncio:16")
    monkeypatch.setattr("bench.peers.toolq_peer.ToolqClient", lambda url, tool: object())
    ad = Adapter("redis://127.0.0.1:1/0")
    assert ad.concurrency.startswith("16 (configured: --pool asyncio -c 16)")
    monkeypatch.delenv("BENCH_TOOLQ_POOL")
    assert Adapter("redis://127.0.0.1:1/0").concurrency.startswith("2 (prefork")
