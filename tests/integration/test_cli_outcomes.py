"""What a user sees when a call goes wrong: ``toolq submit --wait``'s exit status, and the
worker's log lines (no secret, one line for a routine failure), against a real worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import (
    REPO_ROOT,
    start_scheduler,
    start_toolq,
    stop_process,
    toolq_env,
    wait_until,
)
from tests.integration.apps import cli_app
from tests.integration.apps.cli_app import APP, TOKEN
from toolq import State, ToolQueue
from toolq.core.envelope import ToolError
from toolq.core.keys import Keys
from toolq.process.procs import pdeathsig_preexec


@pytest.fixture(scope="module")
def worker_log(tmp_path_factory: pytest.TempPathFactory, module_redis_url: str) -> Iterator[Path]:
    """The combined stdout and stderr of a ``toolq worker`` at INFO serving the app."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with log.open("wb") as out:
        proc = start_toolq(
            [
                "worker",
                "--app",
                APP,
                "--redis-url",
                module_redis_url,
                "-P",
                "threads",
                "-c",
                "2",
                "--loglevel",
                "INFO",
            ],
            stdout=out.fileno(),
            stderr=subprocess.STDOUT,
        )
    # A deployment as a user runs it: with a scheduler, both seen live before the first
    # submit (else `toolq submit` rightly warns on stderr that nothing serves its queue).
    scheduler = start_scheduler(APP, module_redis_url)
    client = redis.Redis.from_url(module_redis_url)
    try:
        keys = Keys()
        assert wait_until(lambda: client.hexists(keys.workers, "toolq.calls"), timeout=30)
        assert wait_until(lambda: client.hlen(keys.schedulers) > 0, timeout=30)
        yield log
    finally:
        client.close()
        stop_process(scheduler, timeout=10)
        stop_process(proc, timeout=10)


@pytest.fixture(scope="module")
def tq(module_redis_url: str, worker_log: Path) -> Iterator[ToolQueue]:
    cli_app.tq.configure(redis_url=module_redis_url)
    yield cli_app.tq
    cli_app.tq.close()


def submit(url: str, tool: str, args: str = "{}", *extra: str) -> subprocess.CompletedProcess[str]:
    """``toolq submit`` in a process of its own, as a user runs it."""
    where = ["--app", APP, "--redis-url", url]
    return subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "submit", tool, "--args", args, *extra, *where],
        env=toolq_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def state_of(tq: ToolQueue, ref: str) -> State | None:
    rec = tq.get(ref)
    return rec.state if rec is not None else None


# --------------------------------------------------------------------------- the worker's log


def test_the_worker_logs_no_secret_and_one_line_per_routine_failure(
    tq: ToolQueue, worker_log: Path
) -> None:
    # Given a tool raising an exception whose message carries a token, and one whose
    # dropped connection the classifier turned into a routine failure
    leaked = tq.submit("leak", {}).operation_ref
    dropped = tq.submit("dropped", {}).operation_ref

    # When the worker has run both
    leak_env, dropped_env = tq.wait(leaked, timeout=30), tq.wait(dropped, timeout=30)
    assert isinstance(leak_env, ToolError) and leak_env.code == "UPSTREAM_ERROR"
    assert isinstance(dropped_env, ToolError) and dropped_env.code == "ATTEMPTS_EXHAUSTED"
    redacted = "RuntimeError: upstream said: token [redacted]"
    assert wait_until(lambda: redacted in worker_log.read_text(), timeout=10), (
        worker_log.read_text()[-3000:]
    )

    # Then the unexpected one is logged with its operation_ref and a traceback, token removed
    log = worker_log.read_text()
    assert TOKEN not in log and "sk-live" not in log
    assert any(leaked in line for line in log.splitlines())
    # And the routine one is one line with its operation_ref and code, no traceback
    lines = [line for line in log.splitlines() if dropped in line]
    assert len(lines) == 1 and "DEPENDENCY_UNAVAILABLE" in lines[0], lines
    assert "ConnectionResetError" not in log


# --------------------------------------------------------------------------- exit status


def test_succeeded_exits_0_and_prints_the_envelope(tq: ToolQueue, module_redis_url: str) -> None:
    result = submit(module_redis_url, "echo", '{"text": "ok"}', "--wait", "30")
    assert result.returncode == 0, result.stderr
    ref, *envelope = result.stdout.splitlines()
    assert json.loads("".join(envelope))["result"] == {"text": "ok"}
    assert tq.get(ref) is not None and result.stderr == ""


def test_escalated_and_cancelled_exit_1_and_say_so(tq: ToolQueue, module_redis_url: str) -> None:
    escalated = submit(module_redis_url, "leak", "{}", "--wait", "30")
    assert escalated.returncode == 1, escalated.stderr
    ref = escalated.stdout.splitlines()[0]
    assert json.loads("".join(escalated.stdout.splitlines()[1:]))["ok"] is False
    assert escalated.stderr.strip() == f"{ref}: escalated (UPSTREAM_ERROR)"

    held = tq.submit("transfer", {"text": "x"}).operation_ref
    tq.cancel(held)
    cancelled = submit(module_redis_url, "transfer", '{"text": "x"}', "--ref", held, "--wait", "5")
    assert cancelled.returncode == 1, cancelled.stderr
    assert cancelled.stderr.strip() == f"{held}: cancelled (OPERATION_CANCELLED)"


def test_waiting_for_a_person_exits_4(tq: ToolQueue, module_redis_url: str) -> None:
    result = submit(module_redis_url, "transfer", '{"text": "y"}', "--wait", "30")
    assert result.returncode == 4, result.stderr
    ref = result.stdout.splitlines()[0]
    assert json.loads("".join(result.stdout.splitlines()[1:]))["next_action"] == "request_approval"
    assert result.stderr.startswith(f"{ref}: awaiting_approval (")


def test_still_pending_exits_3_with_or_without_an_envelope(
    tq: ToolQueue, module_redis_url: str, redis_url: str
) -> None:
    # Waiting ten minutes to retry: wait returns its RATE_LIMITED envelope, yet it is not over
    ref = tq.submit("limited", {}).operation_ref
    assert wait_until(lambda: state_of(tq, ref) is State.WAITING_RETRY, timeout=30)
    waiting = submit(module_redis_url, "limited", "{}", "--ref", ref, "--wait", "0")
    assert waiting.returncode == 3, waiting.stderr
    assert json.loads("".join(waiting.stdout.splitlines()[1:]))["code"] == "RATE_LIMITED"
    assert waiting.stderr.strip() == f"{ref}: still waiting_retry after 0 s"

    # On a database no worker serves: still queued, with nothing to print but the ref
    queued = submit(redis_url, "echo", "{}", "--wait", "0")
    assert queued.returncode == 3, queued.stderr
    assert len(queued.stdout.splitlines()) == 1
    assert queued.stderr.strip().endswith(": still queued after 0 s")


def test_ctrl_c_while_waiting_exits_130_and_the_operation_goes_on(redis_url: str) -> None:
    # Given `toolq submit --wait` waiting on a database no worker serves
    ref = "cli/interrupted"
    where = ["--app", APP, "--redis-url", redis_url]
    proc = start_toolq(
        ["submit", "echo", "--args", '{"text": "x"}', "--ref", ref, "--wait", "600", *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        # (its last line before it waits: no scheduler runs here)
        line = b""
        while b"no live scheduler" not in line and proc.poll() is None:
            line = proc.stderr.readline()
        # When the terminal's Ctrl-C reaches its process group
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    # Then it says the operation goes on and exits 130, not 1 (which says it failed)
    assert proc.returncode == 130, err
    assert err.decode().strip().endswith(f"{ref}: no longer waited for; it goes on")
    assert "Aborted" not in err.decode()
    reader = ToolQueue(redis_url=redis_url)
    try:
        assert state_of(reader, ref) is State.QUEUED
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("echo", '{"text": 5}', "INVALID_ARGUMENTS"),
        ("nope", "{}", "UNKNOWN_TOOL"),
        ("echo", "{nope", "--args is not valid JSON"),
    ],
)
def test_bad_input_exits_2_in_one_line(
    tq: ToolQueue, module_redis_url: str, tool: str, args: str, message: str
) -> None:
    result = submit(module_redis_url, tool, args, "--wait", "5")
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_ref_with_a_dot_segment_exits_2_in_one_line(tq: ToolQueue, module_redis_url: str) -> None:
    result = submit(module_redis_url, "echo", '{"text": "x"}', "--ref", "./fz/ab/target")
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "none empty, '.' or '..'" in result.stderr
    assert tq.get("./fz/ab/target") is None


def test_a_plain_celery_worker_redacts_its_log_too(redis_url: str, tmp_path: Path) -> None:
    # Given the same app served by `celery -A module:celery_app worker`, not `toolq worker`
    log = tmp_path / "celery.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                f"{cli_app.__name__}:celery_app",
                "worker",
                "-P",
                "threads",
                "-c",
                "1",
                "--loglevel",
                "INFO",
            ],
            env=toolq_env({"TOOLQ_REDIS_URL": redis_url}),
            cwd=str(REPO_ROOT),
            stdout=out.fileno(),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=pdeathsig_preexec(),
        )
    q = ToolQueue(redis_url=redis_url)
    q.registry.add(cli_app.tq.registry.get("leak"))
    try:
        # When a tool raises an exception whose message carries a token
        ref = q.submit("leak", {}).operation_ref
        env = q.wait(ref, timeout=60)
        assert isinstance(env, ToolError) and env.code == "UPSTREAM_ERROR"
        redacted = "RuntimeError: upstream said: token [redacted]"
        assert wait_until(lambda: redacted in log.read_text(), timeout=10), log.read_text()[-3000:]
    finally:
        q.close()
        stop_process(proc, timeout=10)

    # Then the token is nowhere in the worker's output, and the ref is
    text = log.read_text()
    assert TOKEN not in text and "sk-live" not in text
    assert ref in text
