"""``toolq up`` end to end: a real stack in a subprocess, driven by other toolq commands."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import (
    descendants,
    free_port,
    pid_gone,
    start_toolq,
    stop_process,
    toolq_env,
    wait_until,
)
from toolq.adapters.embedded import EmbeddedServer, url_for_db
from toolq.adapters.stack_state import read_state

# No URL, state dir or app from the environment: only the state directory finds them.
UNSET = ("TOOLQ_REDIS_URL", "TOOLQ_STATE_DIR", "TOOLQ_APP")
INVOICE = json.dumps({"customer": "acme", "amount": 42})


def _toolq(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", *args],
        cwd=cwd,
        env=toolq_env(unset=UNSET),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start_up(cwd: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = (cwd / "up.log").open("ab")
    p = start_toolq(
        ["up", "--metrics-port", "0", "--api-port", "0", *extra],
        cwd=cwd,
        unset=UNSET,
        stdout=out.fileno(),
        stderr=subprocess.STDOUT,
    )
    out.close()
    return p, cwd / "up.log"


def _wait_ready(p: subprocess.Popen[bytes], cwd: Path, log: Path) -> dict[str, object]:
    ok = wait_until(lambda: read_state(cwd / ".toolq") or p.poll() is not None, timeout=30)
    assert ok and p.poll() is None, log.read_text()
    state = read_state(cwd / ".toolq")
    assert state is not None
    # valkey, scheduler, a calls worker, a verify worker (and the API when installed)
    assert wait_until(lambda: len(descendants(p.pid)) >= 4, timeout=15), log.read_text()
    return state


def _assert_all_gone(pids: set[int]) -> None:
    assert wait_until(lambda: all(pid_gone(pid) for pid in pids), timeout=10), [
        pid for pid in pids if not pid_gone(pid)
    ]


def test_up_serves_other_commands_and_stops_everything(tmp_path: Path) -> None:
    # Given `toolq up` running in a directory, with nothing but its state to find it by
    p, log = _start_up(tmp_path)
    try:
        state = _wait_ready(p, tmp_path, log)
        assert str(state["redis_url"]).startswith("redis://127.0.0.1:")
        assert state["app"] == "toolq.examples.invoices:tq"
        assert "serving on redis://127.0.0.1:" in log.read_text()
        assert (tmp_path / ".toolq" / "data" / "valkey.conf").exists()

        # When another terminal submits through the CLI in the same directory
        args = json.dumps({"customer": "acme", "amount": 42})
        sub = _toolq(tmp_path, "submit", "create_invoice", "--args", args, "--wait", "30")
        assert sub.returncode == 0, sub.stderr
        ref = sub.stdout.splitlines()[0].strip()
        assert json.loads("".join(sub.stdout.splitlines()[1:]))["ok"] is True

        # Then show and status see it, and a second `up` here is refused in one line
        shown = _toolq(tmp_path, "show", ref, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["state"] == "succeeded"
        status = _toolq(tmp_path, "status", "--json")
        assert status.returncode == 0, status.stderr
        states = json.loads(status.stdout)["tools"]["create_invoice"]["states"]
        assert states.get("succeeded") == 1
        again = _toolq(tmp_path, "up")
        assert again.returncode != 0
        assert len(again.stderr.strip().splitlines()) == 1
        assert "already running" in again.stderr
        if state.get("metrics_url"):
            with urllib.request.urlopen(str(state["metrics_url"]), timeout=5) as resp:
                assert resp.status == 200

        pids = descendants(p.pid)
    finally:
        # When it gets SIGTERM
        code = stop_process(p, signal.SIGTERM, timeout=30)
    # Then it exits cleanly, leaves no process and no state file behind
    assert code == 0, log.read_text()
    _assert_all_gone(pids)
    assert read_state(tmp_path / ".toolq") is None

    # And a restart on the same data directory keeps the ledger (append-only file)
    p, log = _start_up(tmp_path, "--no-api")
    try:
        _wait_ready(p, tmp_path, log)
        shown = _toolq(tmp_path, "show", ref, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["state"] == "succeeded"
        pids = descendants(p.pid)
    finally:
        # Ctrl-C stops everything too
        code = stop_process(p, signal.SIGINT, timeout=30)
    assert code == 0, log.read_text()
    _assert_all_gone(pids)


def test_up_on_a_server_away_starts_anyway_and_serves_once_it_answers(tmp_path: Path) -> None:
    # Given a server that is not up yet (its port known): `toolq up` used to exit at once
    server = EmbeddedServer(tmp_path / "valkey", port=free_port(), appendonly=True)
    url = url_for_db(server.url, 0)
    p, log = _start_up(tmp_path, "--no-api", "--redis-url", url)
    try:
        # When it starts: one line says so, and its processes wait (none exits)
        assert wait_until(lambda: "starting anyway" in log.read_text(), timeout=30), log.read_text()
        assert wait_until(lambda: len(descendants(p.pid)) >= 3, timeout=30), log.read_text()
        assert p.poll() is None, log.read_text()
        assert log.read_text().count("does not answer") == 1, log.read_text()

        # Then, the server up, the stack serves a call end to end
        server.start()
        assert wait_until(lambda: read_state(tmp_path / ".toolq") is not None, timeout=60), (
            log.read_text()
        )
        sub = _toolq(
            tmp_path, "submit", "create_invoice", "--args", INVOICE, "--wait", "60", timeout=90
        )
        assert sub.returncode == 0, (sub.stdout, sub.stderr, log.read_text()[-3000:])
        assert p.poll() is None
        pids = descendants(p.pid)
    finally:
        code = stop_process(p, signal.SIGINT, timeout=30)
        server.stop()
    assert code == 0, log.read_text()
    _assert_all_gone(pids)


@pytest.mark.parametrize(
    ("app", "error"),
    [
        ("nosuch:tq", "cannot import 'nosuch': ModuleNotFoundError: No module named 'nosuch'"),
        ("toolq.examples.invoices:nope", "'toolq.examples.invoices' has no attribute 'nope'"),
        ("nosuch", "--app must look like MODULE:ATTR, got 'nosuch'"),
    ],
)
def test_up_with_a_wrong_app_fails_once_before_starting_anything(
    tmp_path: Path, app: str, error: str
) -> None:
    res = _toolq(tmp_path, "up", "--app", app)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"Error: {error}"]
    assert res.stdout == ""  # no "serving on", no process table
    assert not (tmp_path / ".toolq").exists()  # no state written, no server's data directory


def test_nothing_outlives_a_sigkilled_up(tmp_path: Path) -> None:
    # Given `toolq up` with everything started
    p, log = _start_up(tmp_path, "--no-api", "--no-metrics")
    try:
        _wait_ready(p, tmp_path, log)
        pids = descendants(p.pid)
        # When only the `up` process itself is SIGKILLed (no chance to clean up)
        p.kill()
        p.wait(timeout=10)
    finally:
        stop_process(p)
    # Then every process it started dies with it (PR_SET_PDEATHSIG)
    _assert_all_gone(pids)
    # And a command that finds the server by the stale state file says what happened
    status = _toolq(tmp_path, "status")
    assert status.returncode == 2
    assert status.stderr.strip().splitlines() == [
        f"Error: the `toolq up` recorded in .toolq/state.json (pid {p.pid}) is no longer "
        "running; start it again or pass --redis-url"
    ]
    # And the stale state file does not stop the next `up` from starting
    p, log = _start_up(tmp_path, "--no-api", "--no-metrics")
    try:
        _wait_ready(p, tmp_path, log)
    finally:
        assert stop_process(p, signal.SIGTERM, timeout=30) == 0, log.read_text()


@pytest.mark.parametrize(
    "env",
    [
        {"TOOLQ_CLUSTER": "1"},
        {"TOOLQ_CLUSTER": "true", "TOOLQ_CELLS": "256"},
        {
            "TOOLQ_CLUSTER": "1",
            "TOOLQ_CELLS": "256",
            "TOOLQ_BROKER_URL": "amqp://guest:s3cret@127.0.0.1:1//",
        },
    ],
)
def test_up_on_a_cluster_without_its_url_is_refused_at_once(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # Not the embedded single server, failing ~40 s later with tracebacks
    res = subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "up"],
        cwd=tmp_path,
        env=toolq_env(env, unset=UNSET),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "Error: TOOLQ_CLUSTER=1 needs the URL of the Cluster's nodes (--redis-url or "
        "TOOLQ_REDIS_URL): `toolq up` alone starts one embedded server, not a Cluster"
    ]
    assert not (tmp_path / ".toolq").exists()


CELERY_BANNER = "[queues]"  # a line of the banner each Celery worker prints at start


def test_up_is_quiet_by_default_and_shows_celerys_banners_and_task_lines_at_info(
    tmp_path: Path,
) -> None:
    args = json.dumps({"customer": "acme", "amount": 42})
    for loglevel in ("WARNING", "INFO"):
        # Given `toolq up` at its default level, then at `-l info`
        run = tmp_path / loglevel
        run.mkdir()
        extra = ("--no-api",) if loglevel == "INFO" else ()
        p, log = _start_up(run, *extra, *(("-l", "info") if loglevel == "INFO" else ()))
        try:
            _wait_ready(p, run, log)
            # When a call runs through it (so every worker has started and served)
            sub = _toolq(run, "submit", "create_invoice", "--args", args, "--wait", "30")
            assert sub.returncode == 0, sub.stderr
            ref = sub.stdout.splitlines()[0].strip()
        finally:
            code = stop_process(p, signal.SIGTERM, timeout=30)
        assert code == 0, log.read_text()
        text = log.read_text()
        if loglevel == "WARNING":
            # Then by default: toolq's own table, one line per process it started, no
            # Celery banner, no uvicorn INFO, no line per task
            assert CELERY_BANNER not in text, text
            assert "Uvicorn running" not in text and "INFO" not in text, text
            assert " succeeded in " not in text and " received" not in text, text
            for name in ("scheduler", "calls-1", "verify-1", "api"):
                lines = [ln for ln in text.splitlines() if ln.startswith(f"  {name:<10} pid ")]
                assert len(lines) == 1, text
        else:
            # Then at INFO: both workers' banners, and one line for the task (not two)
            assert text.count(CELERY_BANNER) == 2, text
            assert sum(" succeeded in " in ln for ln in text.splitlines()) == 1, text
            assert not any("Task toolq" in ln and " received" in ln for ln in text.splitlines())
        assert ref


def test_up_reports_every_port_in_use_at_once_and_starts_nothing(tmp_path: Path) -> None:
    # Given the metrics port and the API port both taken
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        metrics, api = a.getsockname()[1], b.getsockname()[1]
        # When `toolq up` is asked for both
        res = _toolq(tmp_path, "up", "--metrics-port", str(metrics), "--api-port", str(api))
    # Then one refusal names both, with the way out, and nothing was started
    assert res.returncode == 2, res.stdout + res.stderr
    assert "2 ports are in use" in res.stderr, res.stderr
    assert f"port {metrics} for metrics on 127.0.0.1 is in use" in res.stderr
    assert f"port {api} for api on 127.0.0.1 is in use" in res.stderr
    assert res.stderr.count("pass --") == 2 and "--metrics-port 0" in res.stderr
    assert res.stdout == ""  # no "serving on", no process table
    assert not (tmp_path / ".toolq" / "data").exists()
    assert read_state(tmp_path / ".toolq") is None
