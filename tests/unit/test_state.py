"""The state file ``toolq up`` leaves behind: a dead owner is named, never a bare Redis error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from toolq.cli import main
from toolq.cli.common import CliError, resolve_url
from toolq.errors import RequestRefused
from toolq.state import dead_owner, discover_redis_url, owner, write_state

URL = "redis://127.0.0.1:6999/0"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TOOLQ_REDIS_URL", "TOOLQ_STATE_DIR", "TOOLQ_APP"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _record(state_dir: Path, **fields: Any) -> None:
    write_state({"redis_url": URL, "app": "toolq.examples.invoices:tq", **fields}, state_dir)


def test_a_dead_up_is_named_with_its_pid_and_state_file(tmp_path: Path, dead_pid: int) -> None:
    _record(tmp_path, **(owner() | {"pid": dead_pid}))
    assert dead_owner({"pid": dead_pid}) == dead_pid
    with pytest.raises(CliError) as info:
        resolve_url(None, tmp_path)
    message = info.value.message
    assert message == (
        f"the `toolq up` recorded in {tmp_path / 'state.json'} (pid {dead_pid}) is no longer "
        "running; start it again or pass --redis-url"
    )


def test_every_command_that_reads_the_state_says_so_in_one_line(
    tmp_path: Path, dead_pid: int
) -> None:
    _record(tmp_path, pid=dead_pid)
    for args in (["show", "run_1/step_1"], ["status"], ["submit", "echo", "--args", "{}"]):
        result = CliRunner().invoke(main, [*args, "--state-dir", str(tmp_path)])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and f"(pid {dead_pid}) is no longer running" in lines[0]
        assert "cannot reach Redis" not in result.output


def test_python_callers_get_the_same_refusal(tmp_path: Path, dead_pid: int) -> None:
    _record(tmp_path, pid=dead_pid)
    with pytest.raises(
        RequestRefused, match=r"no longer running; start it again, or pass redis_url"
    ):
        discover_redis_url(tmp_path)


@pytest.mark.parametrize(
    "fields",
    [
        {"pid": os.getpid()},  # running
        {"pid": 1, "hostname": "elsewhere.example"},  # another host: cannot be checked here
        {},  # written by an older toolq: nothing to check
    ],
)
def test_a_live_or_uncheckable_up_gives_its_url(tmp_path: Path, fields: dict[str, Any]) -> None:
    _record(tmp_path, **fields)
    assert resolve_url(None, tmp_path) == URL
    assert discover_redis_url(tmp_path) == URL


def test_an_explicit_url_never_reads_the_state(tmp_path: Path, dead_pid: int) -> None:
    _record(tmp_path, pid=dead_pid)
    assert resolve_url("redis://elsewhere:6379/0", tmp_path) == "redis://elsewhere:6379/0"
