"""``toolq up`` outlives its children: each SIGKILLed one is started again while the
rest keeps serving, and `toolq status` says so. One `toolq up` for the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_up import _start_up, _toolq, _wait_ready
from tests.helpers import pid_gone, stop_process, wait_until
from toolq.adapters.stack_state import read_state


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    cwd: Path
    log: Path

    def child(self, name: str) -> dict[str, Any]:
        state = read_state(self.cwd / ".toolq") or {}
        found: dict[str, Any] = state.get("children", {}).get(name, {})
        return found

    def kill(self, name: str) -> int:
        """SIGKILL child ``name``'s process group, as a crash or the OOM killer would."""
        pid = int(self.child(name)["pid"])
        os.killpg(pid, signal.SIGKILL)
        return pid

    def back(self, name: str, old: int, restarts: int) -> int:
        """Wait until ``name`` runs again under a new pid; returns it."""

        def running() -> bool:
            c = self.child(name)
            return (
                c.get("state") == "running"
                and c.get("restarts") == restarts
                and c.get("pid") not in (None, old)
                and not pid_gone(int(c["pid"]))
            )

        assert wait_until(running, timeout=30), (self.child(name), self.log.read_text())
        return int(self.child(name)["pid"])

    def health(self) -> int:
        state = read_state(self.cwd / ".toolq") or {}
        try:
            with urllib.request.urlopen(f"{state['api_url']}/v1/health", timeout=5) as resp:
                return int(resp.status)
        except (urllib.error.URLError, OSError):
            return 0

    def submit(self, amount: int) -> dict[str, Any]:
        args = json.dumps({"customer": "acme", "amount": amount})
        sub = _toolq(self.cwd, "submit", "create_invoice", "--args", args, "--wait", "60")
        assert sub.returncode == 0, sub.stderr + self.log.read_text()
        result: dict[str, Any] = json.loads("".join(sub.stdout.splitlines()[1:]))
        return result


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    cwd = tmp_path_factory.mktemp("up")
    p, log = _start_up(cwd)
    try:
        state = _wait_ready(p, cwd, log)
        assert state.get("api_url"), "these tests need the api extra"
        yield Up(p, cwd, log)
    finally:
        code = stop_process(p, signal.SIGTERM, timeout=30)
    assert code == 0, log.read_text()


def test_a_killed_calls_worker_comes_back_while_the_api_serves(up: Up) -> None:
    # Given the stack serving
    assert up.submit(1)["ok"] is True
    # When a calls worker is SIGKILLed
    old = up.kill("calls-1")
    # Then the API still answers meanwhile, the worker runs again under a new pid
    assert up.health() == 200
    up.back("calls-1", old, restarts=1)
    assert "toolq up: calls-1 exited (code -9); restarting in 0.5 s (restart 1)" in (
        up.log.read_text()
    )
    # And a call submitted now runs
    assert up.submit(2)["ok"] is True
    assert up.process.poll() is None


def test_a_killed_scheduler_comes_back(up: Up) -> None:
    old = up.kill("scheduler")
    assert up.health() == 200
    up.back("scheduler", old, restarts=1)
    status = _toolq(up.cwd, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert wait_until(
        lambda: json.loads(_toolq(up.cwd, "status", "--json").stdout)["scheduler"]["live"] >= 1,
        timeout=30,
    )


def test_a_killed_api_comes_back(up: Up) -> None:
    old = up.kill("api")
    up.back("api", old, restarts=1)
    assert wait_until(lambda: up.health() == 200, timeout=30), up.log.read_text()
    assert up.submit(3)["ok"] is True


def test_status_shows_the_restarts(up: Up) -> None:
    # (after the tests above: each child killed once)
    status = _toolq(up.cwd, "status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert f"toolq up    pid {up.process.pid}" in lines
    shown = {line.split()[0]: line for line in lines if line.startswith("  ")}
    for name in ("calls-1", "scheduler", "api"):
        assert " running " in shown[name] and "restarts 1" in shown[name], status.stdout
        assert "(last exit code -9," in shown[name]
    assert "restarts 0" in shown["verify-1"]
    snap = json.loads(_toolq(up.cwd, "status", "--json").stdout)
    children = snap["stack"]["children"]
    assert {n: c["restarts"] for n, c in children.items()} == {
        "valkey": 0,
        "scheduler": 1,
        "calls-1": 1,
        "verify-1": 0,
        "api": 1,
    }


def test_a_crash_loop_gives_up_on_that_child_alone(up: Up) -> None:
    # Given verify-1 killed four times, each time started again
    for restarts in range(1, 5):
        up.back("verify-1", up.kill("verify-1"), restarts=restarts)
    # When it exits a fifth time within 60 s
    up.kill("verify-1")
    # Then toolq up gives up on it, says so, and the rest serves on
    assert wait_until(lambda: up.child("verify-1").get("state") == "failed", timeout=30)
    assert "toolq up: verify-1 exited (code -9), 5 times in 60 s; not restarting it again" in (
        up.log.read_text()
    )
    assert up.health() == 200 and up.process.poll() is None
    status = _toolq(up.cwd, "status")
    line = next(x for x in status.stdout.splitlines() if x.startswith("  verify-1 "))
    assert " failed " in line and "restarts 4" in line and "crash loop: not restarted" in line


def test_a_killed_embedded_server_comes_back_with_its_data(up: Up) -> None:
    # (last: the other processes live through the outage as they can, which may
    # restart some of them)
    ref = _toolq(up.cwd, "submit", "create_invoice", "--args", '{"customer": "a", "amount": 4}')
    assert ref.returncode == 0, ref.stderr
    old = up.kill("valkey")
    up.back("valkey", old, restarts=1)
    # the same port (the URL every process holds) and the same ledger (append-only file)
    shown = _toolq(up.cwd, "show", ref.stdout.splitlines()[0].strip(), "--json")
    assert shown.returncode == 0, shown.stderr
    assert wait_until(lambda: up.health() == 200, timeout=30), up.log.read_text()
