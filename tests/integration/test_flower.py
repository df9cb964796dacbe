"""Flower on a toolq app, against the real ``flower`` package and its HTTP API.

`toolq flower` starts it (the one command the README shows); a real worker
sends task events (`-E`). Flower must show each task's tool and
operation_ref, and a task whose operation did not succeed as a failure with
the state and code, never as a plain success.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import (
    free_port,
    start_toolq,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import operator_app
from toolq import ToolQueue

APP = "tests.integration.apps.operator_app:tq"


@pytest.fixture(scope="module")
def flower(module_redis_url: str) -> Iterator[tuple[ToolQueue, str]]:
    """The app on this module's database, a worker sending events, and Flower's URL."""
    tq = operator_app.tq
    tq.configure(redis_url=module_redis_url)
    port = free_port()
    procs = [
        start_worker(APP, module_redis_url, extra_args=["-E"]),
        start_toolq(
            ["flower", "--app", APP, "--redis-url", module_redis_url, "--port", str(port)],
            # Flower 2 answers its API only with auth configured, or when told not to.
            env={"FLOWER_UNAUTHENTICATED_API": "1"},
        ),
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _get(f"{base}/healthcheck") == "OK", 60), "Flower did not start"
        # Flower hears events once a worker's heartbeat event has reached it: before
        # that, a task's first events would be lost to it.
        assert wait_until(lambda: _workers_heard(base), 60), "Flower heard no worker"
        yield tq, base
    finally:
        stop_processes(procs, timeout=5)
        tq.close()


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
    except OSError:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body


def _workers_heard(base: str) -> bool:
    dashboard = _get(f"{base}/workers?json=1")
    return isinstance(dashboard, dict) and any(w.get("status") for w in dashboard["data"])


def tasks(base: str) -> list[dict[str, Any]]:
    return list((_get(f"{base}/api/tasks") or {}).values())


def shown(base: str, ref: str, name: str, state: str) -> dict[str, Any] | None:
    """The task Flower shows for ``ref`` with that name, once it reached ``state``."""
    for t in tasks(base):
        if t["name"] == name and ref in (t.get("args") or "") and t["state"] == state:
            return t
    return None


def test_flower_shows_tool_ref_and_outcome(flower: tuple[ToolQueue, str]) -> None:
    tq, base = flower
    # Given a write that succeeds, a read that escalates, and a write whose reply was lost
    assert tq.call("charge", {"mode": "ok"}, operation_ref="flower/ok", timeout=30).ok
    escalated = tq.call("lookup", {"mode": "crash"}, operation_ref="flower/esc", timeout=30)
    assert not escalated.ok and escalated.next_action == "escalate"
    lost = tq.call("charge", {"mode": "unknown"}, operation_ref="flower/lost", timeout=30)
    assert lost.ok  # verification found the write

    # Then Flower names the tool and the ref of every task...
    ok = wait_until(lambda: shown(base, "flower/ok", "toolq.run", "SUCCESS"), 30)
    assert ok, tasks(base)
    task = shown(base, "flower/ok", "toolq.run", "SUCCESS")
    assert task is not None and task["args"] == "charge('flower/ok', attempt=1)"
    assert task["result"] == "'succeeded'"
    # ...shows the escalated one as a failure with its state and code...
    assert wait_until(lambda: shown(base, "flower/esc", "toolq.run", "FAILURE"), 30), tasks(base)
    task = shown(base, "flower/esc", "toolq.run", "FAILURE")
    assert task is not None and task["args"] == "lookup('flower/esc', attempt=1)"
    assert task["exception"].startswith("OperationNotSucceeded('escalated ")
    # ...and the lost reply as an attempt that ended verifying, then a check that succeeded
    assert wait_until(lambda: shown(base, "flower/lost", "toolq.verify", "SUCCESS"), 30)
    check = shown(base, "flower/lost", "toolq.verify", "SUCCESS")
    assert check is not None and check["args"] == "charge('flower/lost', attempt=1, check=1)"
    attempt = shown(base, "flower/lost", "toolq.run", "FAILURE")
    assert attempt is not None and "verifying" in attempt["exception"]
    # No task that left its operation unfinished or failed reads as a plain success
    for t in tasks(base):
        if t["state"] == "SUCCESS":
            assert t["result"] == "'succeeded'", t
