"""A broker outage outlived (issue 25): RabbitMQ SIGKILLed for longer than the ~8 s
after which every relay with something to publish used to exit (kombu's
OperationalError from ``Connection.default_channel`` was not retried), calls
submitted meanwhile, RabbitMQ started again on the same port.

Real processes: a relay, a worker and a scheduler on RabbitMQ (outbox mode). The
relay must still be alive, say in its beat that it waits for the broker (what
``toolq status`` shows), log the outage once rather than once per try, and every
call must run exactly once after the broker is back.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import start_scheduler, start_toolq, start_worker, stop_process, wait_until
from tests.integration.apps import outbox_app
from tests.integration.conftest import effects
from tests.rabbit import RabbitServer, start_rabbit
from toolq import ToolQueue
from toolq.monitor import status_snapshot

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

    from toolq.api import ApiSettings, create_app

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
        for p in (relay, worker, scheduler):
            stop_process(p, timeout=5)
    said = log_path.read_text(errors="replace")
    # One line when the wait started and one when it ended, not one per try.
    assert said.count("the broker unavailable") == 1, said[-3000:]
    assert said.count("the broker back after") == 1, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
