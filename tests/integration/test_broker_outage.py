"""A broker outage outlived (issue 25): RabbitMQ SIGKILLed for longer than the ~8 s
after which every relay with something to publish used to exit (kombu's
OperationalError from ``Connection.default_channel`` was not retried), calls
submitted meanwhile, RabbitMQ started again on the same port.

Real processes: a relay, a worker and a scheduler on RabbitMQ (outbox mode). The
relay must still be alive, say in its beat that it waits for the broker (what
``toolq status`` shows), log the outage once rather than once per try, and every
call must run exactly once after the broker is back.

And the other way round, in the same deployment shape: the ledger's server away
while RabbitMQ is up. A message delivered meanwhile cannot be claimed; it must go
back to RabbitMQ (it used to be acknowledged unrun, its call left to the
scheduler's republish after ``recovery.unclaimed_after``) and run once the
ledger's server answers again.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    free_port,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import outbox_app, requeue_app
from tests.integration.conftest import effects
from tests.rabbit import RabbitServer, start_rabbit
from toolq import ToolQueue
from toolq.adapters.broker.depth import Depths
from toolq.adapters.embedded import EmbeddedServer, url_for_db
from toolq.edges.monitor import status_snapshot

APP = outbox_app.APP
#: Longer than the relay's old failure point (~8 s), short enough for CI.
DOWN_S = 12.0


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitServer]:
    server = start_rabbit()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tq(rabbit: RabbitServer, module_redis_url: str) -> Iterator[ToolQueue]:
    app = outbox_app.tq
    app.configure(redis_url=module_redis_url)
    app.app.configure_broker(rabbit.url)
    yield app
    app.close()


def relay_beats(tq: ToolQueue) -> list[dict[str, Any]]:
    raw = tq.redis.hgetall(tq.app.ledger.keys.relays)
    return [json.loads(v) for v in raw.values()]


def waited_for(tq: ToolQueue) -> list[str]:
    return [b["waiting"]["for"] for b in relay_beats(tq) if "waiting" in b]


def _console_overview(tq: ToolQueue) -> str:
    """The console's live overview, rendered by the real app on this deployment."""
    from starlette.testclient import TestClient

    from toolq.edges.api import ApiSettings, create_app

    token = "operator-token-0123456789"
    app = create_app(tq, ApiSettings(tokens=f"{token}=*"))
    with TestClient(
        app, base_url="http://localhost:8000", client=("127.0.0.1", 5000), follow_redirects=False
    ) as c:
        csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
        assert csrf is not None
        c.post("/ui/login", data={"csrf": csrf.group(1), "token": token, "next": "/ui/"})
        page = c.get("/ui/overview/live")
        assert page.status_code == 200
        return page.text


def test_the_relay_and_the_worker_outlive_rabbitmq_down_longer_than_before(
    tq: ToolQueue, rabbit: RabbitServer, module_redis_url: str, tmp_path: Path
) -> None:
    env = {"TOOLQ_REDIS_URL": module_redis_url, "TOOLQ_BROKER_URL": rabbit.url}
    log_path = tmp_path / "relay.log"
    with log_path.open("wb") as log:
        relay = start_toolq(
            ["relay", "--app", APP, "--loglevel", "INFO"], env=env, stderr=log.fileno()
        )
    worker = start_worker(APP, module_redis_url, pool="threads", concurrency=2, env=env)
    scheduler = start_scheduler(APP, module_redis_url, env=env)
    try:
        # Given a deployment that serves calls
        first = tq.submit("pay", {}, operation_ref="outage/rabbit/warm").operation_ref
        assert tq.wait(first, timeout=60).ok

        # When RabbitMQ is killed and calls are submitted while it is down
        rabbit.kill()
        down_at = time.monotonic()
        refs = [
            tq.submit("pay", {}, operation_ref=f"outage/rabbit/{i}").operation_ref for i in range(5)
        ]
        # the relay says in its beat what it waits for (toolq status reads it)
        assert wait_until(lambda: waited_for(tq) == ["broker"], timeout=20), relay_beats(tq)

        # and so does the worker (its heartbeat): toolq status names both
        def waiting() -> set[str]:
            snap = status_snapshot(tq)
            return {f"{w['who'].split()[0]} {w['for']}" for w in snap["waiting"]}

        assert wait_until(lambda: waiting() == {"relay broker", "worker broker"}, timeout=20), (
            waiting()
        )
        assert "relay " in (page := _console_overview(tq)) and "waiting for the broker" in page
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - down_at)))  # keep it down
        assert relay.poll() is None, "the relay exited while the broker was down"
        rabbit.start()

        # Then every call runs, once, and the relay is still the same process
        for ref in refs:
            env_ = tq.wait(ref, timeout=90)
            assert env_.ok, (ref, env_)
            assert effects(tq.redis, ref) == 1, ref
        assert relay.poll() is None and worker.poll() is None and scheduler.poll() is None
        assert wait_until(lambda: not waited_for(tq), timeout=10), relay_beats(tq)
    finally:
        stop_processes((relay, worker, scheduler), timeout=5)
    said = log_path.read_text(errors="replace")
    # One line when the wait started and one when it ended, not one per try.
    assert said.count("the broker unavailable") == 1, said[-3000:]
    assert said.count("the broker back after") == 1, said[-3000:]
    assert "Traceback" not in said, said[-3000:]


#: Longer than the claim's patience (3 s in requeue_app), by more than the 5 s it was
#: longer than the default 10 s: at least one delivery gives up meanwhile.
LEDGER_DOWN_S = 9.0


@pytest.fixture
def ledger_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A Valkey of this test's own (the session's is shared), kept on its port and data."""
    s = EmbeddedServer(tmp_path / "valkey", port=free_port(), appendonly=True)
    yield s
    s.stop()


def test_a_delivery_the_ledger_cannot_claim_goes_back_to_rabbitmq_and_runs_once_it_is_back(
    rabbit: RabbitServer, ledger_server: EmbeddedServer, tmp_path: Path
) -> None:
    ledger_server.start()
    url = url_for_db(ledger_server.url, 0)
    env = {"TOOLQ_REDIS_URL": url, "TOOLQ_BROKER_URL": rabbit.url}
    app = requeue_app.APP
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = start_toolq(
            ["worker", "--app", app, "--pool", "threads", "-c", "1", "--loglevel", "INFO"],
            env=env,
            stderr=log.fileno(),
        )
    relay = start_toolq(["relay", "--app", app, "--loglevel", "WARNING"], env=env)
    scheduler = start_scheduler(app, url, env=env)
    tq: ToolQueue = requeue_app.tq
    tq.configure(redis_url=url)
    tq.app.configure_broker(rabbit.url)
    calls = tq.settings.queues.calls
    probe = Depths(rabbit.url)
    try:
        # Given a deployment that serves calls, whose worker then stops taking messages
        # from the calls queue (Celery's remote control, over RabbitMQ)
        assert tq.wait(tq.submit("pay", {}, operation_ref="requeue/warm").operation_ref, 60).ok
        control = tq.app.celery.control
        assert control.cancel_consumer(calls, reply=True, limit=1, timeout=10)

        def consuming() -> set[str] | None:
            found = control.inspect(timeout=2, limit=1).active_queues()
            return {q["name"] for qs in found.values() for q in qs} if found else None

        # (the reply comes before the worker's loop cancels: wait until it has)
        assert wait_until(lambda: (c := consuming()) is not None and calls not in c, 20)

        # When a call is published to RabbitMQ, the ledger's server is SIGKILLed, and
        # the worker takes the message: its claim cannot reach the ledger
        ref = tq.submit("pay", {}, operation_ref="requeue/1").operation_ref
        outbox = tq.app.ledger.keys.outbox
        assert wait_until(
            lambda: probe.read([calls])[calls] == 1 and tq.redis.xlen(outbox) == 0, 20
        )
        ledger_server.kill()
        assert control.add_consumer(calls, reply=True, limit=1, timeout=10)
        time.sleep(LEDGER_DOWN_S)  # keep it down past the claim's patience
        assert worker.poll() is None
        ledger_server.start()

        # Then the call runs, once: its message went back to RabbitMQ and came again
        # (before, it was acknowledged unrun, and nothing published it for an hour)
        done = tq.wait(ref, timeout=60)
        assert done.ok, done
        assert effects(tq.redis, ref) == 1
        assert worker.poll() is None
    finally:
        probe.close()
        tq.close()
        stop_processes((worker, relay, scheduler), timeout=5)
    said = log_path.read_text(errors="replace")
    # One warning line a delivery given back, without a traceback
    requeued = [line for line in said.splitlines() if "requeued: requeue/1 attempt 1" in line]
    assert requeued and all("WARNING" in line for line in requeued), said[-3000:]
    assert "Traceback" not in said, said[-3000:]
