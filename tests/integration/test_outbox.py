"""Outbox mode end to end (issue 18): the ledger on Valkey, Celery's broker a real
RabbitMQ (quorum queues), messages carried by the outbox stream and ``toolq relay``.

Real processes throughout: workers and a scheduler on RabbitMQ, relays killed with
SIGKILL at either side of a publish. The provider stub counts side effects: a
message published twice must not run twice (the claim refuses the copy), and a
message left in the outbox by a dead relay must not be lost (another takes it over).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from tests.helpers import (
    REPO_ROOT,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    stop_processes,
    toolq_env,
    wait_until,
)
from tests.integration.apps import outbox_app
from tests.integration.conftest import effects, seen
from tests.rabbit import RabbitServer, start_rabbit
from toolq import State, ToolQueue
from toolq.adapters.broker.depth import Depths
from toolq.core.keys import OUTBOX_GROUP
from toolq.process.procs import pdeathsig_preexec

APP = outbox_app.APP


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitServer]:
    server = start_rabbit()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(rabbit: RabbitServer, module_redis_url: str) -> dict[str, str]:
    """What every process of the deployment is started with."""
    return {"TOOLQ_REDIS_URL": module_redis_url, "TOOLQ_BROKER_URL": rabbit.url}


@pytest.fixture(scope="module")
def tq(rabbit: RabbitServer, module_redis_url: str) -> Iterator[ToolQueue]:
    app = outbox_app.tq
    app.configure(redis_url=module_redis_url)
    app.app.configure_broker(rabbit.url)
    yield app
    app.close()


def start_outbox_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A prefork worker with one child: its pid is the lease holder's."""
    return start_worker(APP, env["TOOLQ_REDIS_URL"], pool="prefork", concurrency=1, env=env)


@pytest.fixture(scope="module", autouse=True)
def deployment(
    tq: ToolQueue, env: dict[str, str], module_redis_url: str
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A worker and a scheduler, by role (a test may replace the worker)."""
    procs = {
        "worker": start_outbox_worker(env),
        "scheduler": start_scheduler(APP, module_redis_url, env=env),
    }
    yield procs
    stop_processes(procs.values(), timeout=5)


def start_relay(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return start_toolq(["relay", "--app", APP, "--loglevel", "WARNING"], env=env)


def start_dying_relay(env: dict[str, str], when: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.apps.dying_relay", when],
        env=toolq_env(env),
        cwd=str(REPO_ROOT),
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
    )


@pytest.fixture
def relay(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    p = start_relay(env)
    yield p
    stop_process(p, timeout=5)


def outbox_len(tq: ToolQueue) -> int:
    return int(tq.redis.xlen(tq.app.ledger.keys.outbox))


def pending(tq: ToolQueue) -> int:
    return int(tq.redis.xpending(tq.app.ledger.keys.outbox, OUTBOX_GROUP)["pending"])


def duplicates_prevented(tq: ToolQueue) -> int:
    return tq.app.ledger.stats().get("pay|duplicates_prevented", 0)


def test_a_write_goes_ledger_outbox_relay_rabbitmq_worker_and_back(
    tq: ToolQueue, relay: subprocess.Popen[bytes], rabbit: RabbitServer
) -> None:
    ref = tq.submit("pay", {"amount_cents": 5}, operation_ref="box/e2e").operation_ref
    env = tq.wait(ref, timeout=30)

    assert env.ok and env.operation_ref == ref
    assert env.result == {"paid": ref, "attempt": 1}
    assert effects(tq.redis, ref) == 1
    # the message crossed RabbitMQ, not a list in the ledger's Redis
    assert not tq.redis.exists(tq.settings.queues.calls)
    probe = Depths(rabbit.url)
    try:
        # Declared there (a quorum queue) and drained. The worker acknowledges after it
        # records the outcome the wait returned on, so the acknowledgement may still be
        # on its way to RabbitMQ: wait for it rather than read the depth once.
        def drained() -> bool:
            return probe.read([tq.settings.queues.calls]) == {tq.settings.queues.calls: 0}

        assert wait_until(drained, 10)
    finally:
        probe.close()
    assert wait_until(lambda: outbox_len(tq) == 0, 10)  # acknowledged and deleted


def test_a_relay_killed_after_reading_leaves_its_entry_to_another(
    tq: ToolQueue, env: dict[str, str]
) -> None:
    # Given an operation whose message a relay read and died on, unpublished
    ref = tq.submit("pay", {}, operation_ref="box/read-kill").operation_ref
    dying = start_dying_relay(env, "read")
    assert dying.wait(timeout=30) == -signal.SIGKILL
    assert pending(tq) == 1 and outbox_len(tq) == 1
    assert effects(tq.redis, ref) == 0
    # While it waits there with no relay, the scheduler looks at the unclaimed operation
    # (its due time moves a full unclaimed_after past its first one, which only its
    # decision does: a claim of the due item holds it for less) and knows the message
    # is still in the outbox: no republish
    unclaimed_ms = int(tq.settings.recovery.unclaimed_after * 1000)
    assert tq.settings.scheduler.hold * 1000 < unclaimed_ms
    looked_at = int(tq.app.ledger.fields(ref, "created")["created"]) + 2 * unclaimed_ms
    assert wait_until(lambda: (tq.redis.zscore(tq.app.ledger.keys.due, ref) or 0) >= looked_at, 30)
    assert tq.app.ledger.fields(ref, "repubs") == {"repubs": "0"}

    # When another relay starts
    p = start_relay(env)
    try:
        # Then it takes the entry over, and the call completes once. (Not "never
        # republished" from here: once the relay has published it, RabbitMQ's depth no
        # longer counts it while a worker holds it unclaimed, and a scheduler looking
        # then may publish a copy, which the claim refuses.)
        env_ = tq.wait(ref, timeout=30)
        assert env_.ok
        assert effects(tq.redis, ref) == 1 and seen(tq.redis, ref) == [1]
        assert wait_until(lambda: outbox_len(tq) == 0, 10)
    finally:
        stop_process(p, timeout=5)


def test_a_relay_killed_after_publishing_causes_a_copy_the_claim_refuses(
    tq: ToolQueue, env: dict[str, str]
) -> None:
    before = duplicates_prevented(tq)
    # Given a message published, run, and never acknowledged in the outbox
    ref = tq.submit("pay", {}, operation_ref="box/publish-kill").operation_ref
    dying = start_dying_relay(env, "published")
    assert dying.wait(timeout=30) == -signal.SIGKILL
    assert tq.wait(ref, timeout=30).ok
    assert pending(tq) == 1

    # When another relay takes the entry over and publishes it again
    p = start_relay(env)
    try:
        assert wait_until(lambda: outbox_len(tq) == 0, 20)
        # Then the worker got the copy, and its claim refused it: nothing ran twice
        assert wait_until(lambda: duplicates_prevented(tq) > before, 20)
        assert effects(tq.redis, ref) == 1 and seen(tq.redis, ref) == [1]
    finally:
        stop_process(p, timeout=5)


def test_a_worker_killed_mid_write_is_verified_not_run_again(
    tq: ToolQueue, relay: subprocess.Popen[bytes]
) -> None:
    # Given a write that has committed and is still inside the tool
    ref = tq.submit("pay", {"sleep": 30}, operation_ref="box/worker-kill").operation_ref

    def running() -> bool:
        rec = tq.get(ref)
        return effects(tq.redis, ref) == 1 and rec is not None and rec.state is State.RUNNING

    assert wait_until(running, 30)
    holder = tq.app.ledger.fields(ref, "lease_holder")["lease_holder"]

    # When its pool child is killed (RabbitMQ gets the message back, rejected)
    os.kill(int(holder.split(":")[1]), signal.SIGKILL)

    # Then the operation is settled by verification, through the outbox and RabbitMQ
    env = tq.wait(ref, timeout=60)
    assert env.ok and env.verification.evidence_ref == "verification:find_payment"
    assert effects(tq.redis, ref) == 1 and seen(tq.redis, ref) == [1]
    rec = tq.get(ref)
    assert rec is not None
    assert [h.to for h in rec.history][-2:] == [State.VERIFYING, State.SUCCEEDED]


def test_the_relay_publishes_to_rabbitmq_with_confirms(tq: ToolQueue) -> None:
    from toolq.services.relay.brokers import KombuPublish
    from toolq.services.relay.service import Relay

    relay = Relay(tq.app)
    try:
        publisher = relay.publisher
        assert isinstance(publisher, KombuPublish)
        publisher.producer()
        assert publisher.connection is not None
        assert publisher.connection.connection.confirm_publish is True
    finally:
        relay._drop_broker()


def test_the_provider_is_the_ledgers_redis(tq: ToolQueue) -> None:
    """The counts above read the stub in the ledger's own server: check they can fail."""
    assert isinstance(tq.redis, redis.Redis)
    assert effects(tq.redis, "box/never-submitted") == 0


def _console_overview(tq: ToolQueue) -> str:
    """The console's live overview, rendered by the real app on this deployment."""
    import re

    from starlette.testclient import TestClient

    from toolq.edges.api import ApiSettings, create_app

    token = "operator-token-0123456789"
    app = create_app(tq, ApiSettings(tokens=f"{token}=*"))
    with TestClient(
        app, base_url="http://localhost:8000", client=("127.0.0.1", 5000), follow_redirects=False
    ) as c:
        login = c.get("/ui/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', login)
        assert csrf is not None
        c.post("/ui/login", data={"csrf": csrf.group(1), "token": token, "next": "/ui/"})
        page = c.get("/ui/overview/live")
        assert page.status_code == 200
        return page.text


def test_status_shows_the_outbox_the_relays_and_the_brokers_queues(
    tq: ToolQueue, relay: subprocess.Popen[bytes], env: dict[str, str]
) -> None:
    from toolq.edges.cli.monitor import render_status
    from toolq.edges.monitor import status_snapshot

    # Given a relay that has beaten, and a message stuck in the outbox
    assert wait_until(lambda: status_snapshot(tq)["outbox"]["relays"] >= 1, 20)
    assert stop_process(relay, timeout=5) == 0  # SIGTERM: a clean stop
    tq.submit("pay", {}, operation_ref="box/status")

    snap = status_snapshot(tq)
    box = snap["outbox"]
    assert box["entries"] == 1 and box["oldest_age_ms"] is not None
    # the queues are RabbitMQ's, read there; its unacked are its own
    assert set(snap["queues"]["depth"]) == {"toolq.calls", "toolq.verify"}
    assert snap["queues"]["unacked"] is None
    text = render_status(snap)
    assert "outbox      1 waiting" in text
    # the console's overview says the same, and that no relay is live
    page = _console_overview(tq)
    assert "Outbox" in page and "NO live relay" in page and "Unacknowledged" not in page
    assert "Queue <code>toolq.calls</code>" in page  # its depth, read from RabbitMQ

    # and once a relay runs again, the entry is published and gone
    p = start_relay(env)
    try:
        assert tq.wait("box/status", timeout=30).ok
        assert wait_until(lambda: status_snapshot(tq)["outbox"]["entries"] == 0, 10)
    finally:
        stop_process(p, timeout=5)


def test_a_message_lost_in_rabbitmq_is_published_again_once_the_queue_is_empty(
    tq: ToolQueue,
    relay: subprocess.Popen[bytes],
    rabbit: RabbitServer,
    env: dict[str, str],
    deployment: dict[str, subprocess.Popen[bytes]],
) -> None:
    from kombu import Connection

    calls = tq.settings.queues.calls
    probe = Depths(rabbit.url)
    try:
        # Given no worker, and a message the relay published to RabbitMQ
        stop_process(deployment["worker"], timeout=10)
        ref = tq.submit("pay", {}, operation_ref="box/lost").operation_ref
        assert wait_until(lambda: probe.read([calls])[calls] == 1 and outbox_len(tq) == 0, 20)

        # When RabbitMQ loses it (purged), and a worker comes back
        with Connection(rabbit.url) as conn, conn.channel() as channel:
            assert channel.queue_purge(calls) == 1
        deployment["worker"] = start_outbox_worker(env)

        # Then the scheduler, seeing the queue empty and the outbox too, publishes it
        # again (RabbitMQ's queue head cannot be read): the call completes, once
        assert tq.wait(ref, timeout=60).ok
        assert int(tq.app.ledger.fields(ref, "repubs")["repubs"]) >= 1
        assert effects(tq.redis, ref) == 1 and seen(tq.redis, ref) == [1]
    finally:
        probe.close()
