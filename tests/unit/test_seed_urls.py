"""A Cluster's seed nodes in one URL (``redis://[user:password@]a:7000,b:7001``): how it
is split, refused, shown, and handed to redis-py's cluster client."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import SecretStr, ValidationError

from toolq import ToolQueue
from toolq.adapters.ledger.cluster import AsyncLedgerCluster
from toolq.core.settings import ToolqSettings, seed_nodes, seed_urls

SECRET = "s3cr3t-pw"
CLUSTER = {"cluster": True, "cells": 16, "broker_url": "amqp://guest@rabbit//"}


@pytest.mark.parametrize(
    ("url", "seeds"),
    [
        ("redis://a:7000", ["redis://a:7000"]),
        ("redis://a:7000,b:7001", ["redis://a:7000", "redis://b:7001"]),
        # credentials, TLS, database and options apply to every seed
        (
            "rediss://u:p,w@a:7000, b:7001/0?ssl_cert_reqs=none",
            [
                "rediss://u:p,w@a:7000/0?ssl_cert_reqs=none",
                "rediss://u:p,w@b:7001/0?ssl_cert_reqs=none",
            ],
        ),
        ("redis://[::1]:7000,[::1]:7001", ["redis://[::1]:7000", "redis://[::1]:7001"]),
    ],
)
def test_a_url_is_split_into_one_url_per_seed(url: str, seeds: list[str]) -> None:
    assert seed_urls(url) == seeds


def test_the_seeds_are_hosts_and_ports_in_order() -> None:
    assert seed_nodes("redis://:pw@a:7000,b,[::1]:7002/0") == [
        ("a", 7000),
        ("b", 6379),
        ("::1", 7002),
    ]


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@a:7000,redis://:{SECRET}@b:7001",  # whole URLs: one form only
        "redis://a:7000,,b:7001",
        "redis://a:7000,",
    ],
)
def test_a_malformed_list_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ToolqSettings(redis_url=SecretStr(url), **CLUSTER)
    said = "\n".join(str(e["msg"]) for e in caught.value.errors())
    assert "comma-separated host:port pairs" in said and SECRET not in said


def test_a_list_without_cluster_mode_is_refused_in_one_sentence() -> None:
    with pytest.raises(ValidationError) as caught:
        ToolqSettings(redis_url=SecretStr(f"redis://:{SECRET}@a:7000,b:7001"))
    (error,) = caught.value.errors()
    assert "only a Cluster client takes: set TOOLQ_CLUSTER=1" in error["msg"]
    # the same through the client's constructor
    with pytest.raises(ValidationError):
        ToolQueue(f"redis://:{SECRET}@a:7000,b:7001")


def test_every_seed_is_shown_without_the_password() -> None:
    s = ToolqSettings(redis_url=SecretStr(f"redis://u:{SECRET}@a:7000,b:7001/0"), **CLUSTER)
    assert s.safe_url == "redis://u:***@a:7000,b:7001/0"
    assert SECRET not in repr(ToolQueue(settings=s).app)


def test_the_async_client_gets_every_seed_in_order_with_the_first_urls_options() -> None:
    async def made() -> AsyncLedgerCluster:
        return AsyncLedgerCluster.from_seeds(f"rediss://u:{SECRET}@a:7000,b:7001,c:7002/0")

    client = asyncio.run(made())  # no connection yet: redis.asyncio connects on first use
    nodes = list(client.nodes_manager.startup_nodes.values())
    assert [(n.host, n.port) for n in nodes] == [("a", 7000), ("b", 7001), ("c", 7002)]
    for node in nodes:
        kwargs = node.connection_kwargs
        assert kwargs["username"] == "u" and kwargs["password"] == SECRET
        assert node.connection_class.__name__ == "SSLConnection"


@pytest.mark.parametrize(
    "url",
    [
        f"http://:{SECRET}@h/0",
        f"redis://:{SECRET}@a:7000,b:7001/0",
        f"redis://:{SECRET}@127.0.0.1:99999/0",  # a port out of range
        f"redis://u:{SECRET}@[::1/0",  # an IPv6 host without its closing bracket
    ],
)
def test_a_bad_url_is_refused_at_once_and_no_message_quotes_it(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pydantic's own text ends with ``input_value='<the url>'`` unless told not to; the
    # environment (and a plain str) gives it the URL itself, not a SecretStr
    monkeypatch.setenv("TOOLQ_REDIS_URL", url)
    for make in (ToolqSettings, ToolQueue, lambda: ToolqSettings(redis_url=url)):
        with pytest.raises(ValidationError) as caught:
            make()
        assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
