"""Outbox mode with Celery's broker a Valkey behind Sentinel (issue 18): the ledger in
the session's Valkey, the broker a primary and its replica watched by a Sentinel
(:class:`tests.sentinel.SentinelGroup`), named by a ``sentinel://`` URL and
``broker_master_name``. Real worker, scheduler and relay processes.

The failover: the broker's primary is SIGKILLed with calls in flight. The Sentinel
promotes the replica; the relay and the worker find it through the Sentinel and go
on. Messages the dead primary held and had not passed to its replica are lost with
it: the scheduler publishes their operations again (outbox mode's policy,
:func:`toolq.decisions.recovery.policy.on_its_way`: not in the outbox, the broker's queue
empty), and the claim refuses any copy. Every call completes, each tool ran once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.helpers import (
    start_scheduler,
    start_toolq,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import outbox_app
from tests.integration.conftest import effects
from tests.sentinel import SentinelGroup
from toolq import ToolQueue
from toolq.edges.monitor import status_snapshot

APP = outbox_app.APP


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as g:
        yield g


@pytest.fixture(scope="module")
def tq(module_redis_url: str, group: SentinelGroup) -> Iterator[ToolQueue]:
    app = outbox_app.tq
    app.configure(redis_url=module_redis_url)
    app.app.configure_broker(group.url, master_name=group.master_name)
    yield app
    app.close()


@pytest.fixture(scope="module")
def deployment(
    tq: ToolQueue, module_redis_url: str, group: SentinelGroup
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    env = {
        "TOOLQ_REDIS_URL": module_redis_url,
        "TOOLQ_BROKER_URL": group.url,
        "TOOLQ_BROKER_MASTER_NAME": group.master_name,
    }
    procs = {
        "worker": start_worker(APP, module_redis_url, env=env),
        "scheduler": start_scheduler(APP, module_redis_url, env=env),
        "relay": start_toolq(["relay", "--app", APP, "--loglevel", "WARNING"], env=env),
    }
    yield procs
    stop_processes(procs.values(), timeout=5)


def submit_all(tq: ToolQueue, refs: list[str], sleep: float = 0.0) -> None:
    for ref in refs:
        tq.submit("pay", {"sleep": sleep}, operation_ref=ref)


def test_calls_cross_to_a_broker_found_through_its_sentinel(
    tq: ToolQueue, group: SentinelGroup, deployment: dict[str, subprocess.Popen[bytes]]
) -> None:
    refs = [f"sentinel/a{i}" for i in range(10)]
    submit_all(tq, refs)
    assert all(tq.wait(ref, timeout=30).ok for ref in refs)
    assert [effects(tq.redis, ref) for ref in refs] == [1] * 10
    # the messages crossed the Sentinel's primary, not a list in the ledger's Redis
    calls = tq.settings.queues.calls
    assert not tq.redis.exists(calls)
    with group.client() as broker:
        assert broker.exists(f"_kombu.binding.{calls}")
        assert wait_until(lambda: broker.hlen("unacked") == 0, 10)  # acked there
    # toolq status reads the queues' depths through the Sentinel too
    assert status_snapshot(tq)["queues"]["depth"] == {"toolq.calls": 0, "toolq.verify": 0}


def test_a_failover_of_the_broker_loses_no_call_and_runs_none_twice(
    tq: ToolQueue, group: SentinelGroup, deployment: dict[str, subprocess.Popen[bytes]]
) -> None:
    # Given calls in flight, some running and the rest queued on the broker's primary,
    # and a replica that has not received them (cut off: its copy lags behind)
    old, replica = group.primary(), group.replica()
    group.cut_off(replica)
    refs = [f"sentinel/b{i}" for i in range(20)]
    submit_all(tq, refs, sleep=0.5)
    with group.client() as broker:
        calls = tq.settings.queues.calls
        assert wait_until(lambda: broker.llen(calls) >= 10, 20)  # relayed, not yet taken

    # When the broker's primary is SIGKILLed (the Sentinel promotes the replica)
    group.kill_primary()
    assert group.primary() is replica
    more = [f"sentinel/c{i}" for i in range(10)]
    submit_all(tq, more)

    # Then every call completes, each tool ran once: 0 lost, 0 doubled
    outcomes = [tq.wait(ref, timeout=60) for ref in refs + more]
    assert [ref for ref, env in zip(refs + more, outcomes, strict=True) if not env.ok] == []
    assert [r for r in refs + more if effects(tq.redis, r) != 1] == []
    # the queued messages died with the primary: the scheduler published them again
    # (the outbox had let them go, and the promoted replica's queue was empty)
    assert sum(int(tq.app.ledger.fields(r, "repubs")["repubs"]) > 0 for r in refs) >= 1
    # the relay, the worker and the scheduler followed the Sentinel: none exited
    assert {name: p.poll() for name, p in deployment.items()} == dict.fromkeys(deployment)
    assert old.running is False
    # and the deployment goes on serving on the promoted replica
    ref = tq.submit("pay", {}, operation_ref="sentinel/after").operation_ref
    assert tq.wait(ref, timeout=30).ok and effects(tq.redis, ref) == 1
