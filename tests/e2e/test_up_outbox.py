"""``toolq up`` in outbox mode (issue 18): with a broker URL set, the stack starts a
relay beside the scheduler and the workers, and a call made with the CLI crosses
the ledger's outbox and RabbitMQ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import descendants, pid_gone, start_toolq, stop_process, toolq_env, wait_until
from tests.rabbit import RabbitServer, start_rabbit
from toolq.adapters.stack_state import read_state
from toolq.core.redact import redact_url

UNSET = ("TOOLQ_REDIS_URL", "TOOLQ_STATE_DIR", "TOOLQ_APP")


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitServer]:
    server = start_rabbit()
    yield server
    server.stop()


def test_up_with_a_broker_url_runs_a_relay_and_calls_cross_rabbitmq(
    tmp_path: Path, rabbit: RabbitServer
) -> None:
    # Every process of the deployment, the CLI's included, is given the broker URL
    env = {"TOOLQ_BROKER_URL": rabbit.url}

    def toolq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "toolq.edges.cli", *args],
            cwd=tmp_path,
            env=toolq_env(env, unset=UNSET),
            capture_output=True,
            text=True,
            timeout=60,
        )

    log = tmp_path / "up.log"
    with log.open("ab") as out:
        p = start_toolq(
            ["up", "--no-api", "--metrics-port", "0"],
            cwd=tmp_path,
            env=env,
            unset=UNSET,
            stdout=out.fileno(),
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_until(lambda: read_state(tmp_path / ".toolq") or p.poll() is not None, 30)
        assert p.poll() is None, log.read_text()
        assert wait_until(lambda: "relay" in log.read_text(), 15), log.read_text()
        assert "(through the ledger's outbox)" in log.read_text()
        assert "guest:guest" not in log.read_text()  # the broker URL is shown redacted

        args = json.dumps({"customer": "acme", "amount": 42})
        sub = toolq("submit", "create_invoice", "--args", args, "--wait", "30")
        assert sub.returncode == 0, sub.stderr + log.read_text()
        assert json.loads("".join(sub.stdout.splitlines()[1:]))["ok"] is True

        status = json.loads(toolq("status", "--json").stdout)
        assert status["outbox"]["entries"] == 0 and status["queues"]["unacked"] is None
        assert status["tools"]["create_invoice"]["states"]["succeeded"] == 1

        # The stack recorded its broker, without the password; a command that would
        # publish without TOOLQ_BROKER_URL is refused in one sentence naming it
        state = read_state(tmp_path / ".toolq") or {}
        assert state["mode"]["broker"] == redact_url(rabbit.url) != rabbit.url
        bare = subprocess.run(
            [sys.executable, "-m", "toolq.edges.cli", "submit", "create_invoice", "--args", args],
            cwd=tmp_path,
            env=toolq_env(unset=(*UNSET, "TOOLQ_BROKER_URL")),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bare.returncode == 2 and len(bare.stderr.strip().splitlines()) == 1, bare.stderr
        assert f"set TOOLQ_BROKER_URL to the broker {redact_url(rabbit.url)}" in bare.stderr

        # A SIGKILLed relay is started again, and the next call crosses RabbitMQ
        old = state["children"]["relay"]["pid"]
        os.killpg(old, signal.SIGKILL)

        def relay_back() -> bool:
            relay = (read_state(tmp_path / ".toolq") or {})["children"]["relay"]
            return relay["restarts"] == 1 and relay["pid"] != old and not pid_gone(relay["pid"])

        assert wait_until(relay_back, 30), log.read_text()
        sub = toolq("submit", "create_invoice", "--args", args, "--wait", "60")
        assert sub.returncode == 0, sub.stderr + log.read_text()
        assert json.loads("".join(sub.stdout.splitlines()[1:]))["ok"] is True
        pids = descendants(p.pid)
    finally:
        code = stop_process(p, signal.SIGTERM, timeout=30)
    assert code == 0, log.read_text()
    assert wait_until(lambda: all(pid_gone(pid) for pid in pids), 10)
