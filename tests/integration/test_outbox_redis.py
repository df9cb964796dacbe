"""Outbox mode with a Redis of its own as Celery's broker (issue 18): the ledger in
one database, the broker in another, the relay between them. A broker behind Sentinel,
and its failover: test_outbox_sentinel.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.conftest import DatabasePool, _database_url
from tests.helpers import (
    start_scheduler,
    start_toolq,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import outbox_app
from tests.integration.conftest import effects
from toolq import ToolQueue
from toolq.adapters.broker.depth import Depths

APP = outbox_app.APP


@pytest.fixture(scope="module")
def broker_url(valkey: str, valkey_databases: DatabasePool) -> Iterator[str]:
    yield from _database_url(valkey, valkey_databases)


@pytest.fixture(scope="module")
def tq(module_redis_url: str, broker_url: str) -> Iterator[ToolQueue]:
    app = outbox_app.tq
    app.configure(redis_url=module_redis_url)
    app.app.configure_broker(broker_url)
    env = {"TOOLQ_REDIS_URL": module_redis_url, "TOOLQ_BROKER_URL": broker_url}
    procs = [
        start_worker(APP, module_redis_url, env=env),
        start_scheduler(APP, module_redis_url, env=env),
        start_toolq(["relay", "--app", APP, "--loglevel", "WARNING"], env=env),
    ]
    yield app
    stop_processes(procs, timeout=5)
    app.close()


def test_a_write_crosses_from_the_ledgers_outbox_to_a_broker_of_its_own(
    tq: ToolQueue, broker_url: str
) -> None:
    ref = tq.submit("pay", {}, operation_ref="redis-broker/1").operation_ref
    assert tq.wait(ref, timeout=30).ok
    assert effects(tq.redis, ref) == 1
    calls = tq.settings.queues.calls
    # the ledger's database holds no queue; the broker's had the message (kombu's
    # Redis transport delivered it: its queue list was declared there)
    assert not tq.redis.exists(calls)
    broker = redis.Redis.from_url(broker_url)
    try:
        assert broker.exists(f"_kombu.binding.{calls}")
        # the worker acknowledged the delivery on the broker (the ledger could not)
        assert wait_until(lambda: broker.hlen("unacked") == 0, 10)
    finally:
        broker.close()
    assert wait_until(lambda: tq.redis.xlen(tq.app.ledger.keys.outbox) == 0, 10)
    # its drained queue reads 0, not unknown (an empty Redis list does not exist): the
    # scheduler may publish a lost message again after recovery.unclaimed_after
    probe = Depths(broker_url)
    try:
        assert probe.read([calls, "no.such.queue"]) == {calls: 0, "no.such.queue": 0}
    finally:
        probe.close()


def test_a_relay_whose_outbox_was_deleted_makes_it_again_and_goes_on(tq: ToolQueue) -> None:
    # Given the outbox stream (and its consumer group) gone under a running relay
    outbox = tq.app.ledger.keys.outbox
    assert tq.redis.delete(outbox) == 1
    # When a call is made: its script makes the stream again, without the group
    ref = tq.submit("pay", {}, operation_ref="redis-broker/2").operation_ref
    # Then the relay creates the group again, publishes, and the call completes
    assert tq.wait(ref, timeout=30).ok
    assert effects(tq.redis, ref) == 1
