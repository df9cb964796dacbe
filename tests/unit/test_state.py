"""The state file ``toolq up`` leaves behind: a dead owner is named, never a bare Redis error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from toolq.adapters.stack_state import (
    dead_owner,
    discover_redis_url,
    mode_of,
    owner,
    with_mode,
    write_state,
)
from toolq.core.errors import RequestRefused
from toolq.core.settings import ToolqSettings
from toolq.edges.cli import main
from toolq.edges.cli.common import CliError, resolve_url

URL = "redis://127.0.0.1:6999/0"
ENV = (
    "TOOLQ_REDIS_URL",
    "TOOLQ_STATE_DIR",
    "TOOLQ_APP",
    "TOOLQ_CELLS",
    "TOOLQ_CLUSTER",
    "TOOLQ_BROKER_URL",
    "TOOLQ_PREFIX",
    "TOOLQ_DURABILITY",
)
BROKER = "amqp://guest:s3cret@127.0.0.1:5672//"
SHOWN = "amqp://guest:***@127.0.0.1:5672//"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
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


# ----------------------------------------------------------------- the recorded mode

STACK = {"cells": 256, "cluster": False, "prefix": "toolq", "broker": None, "durability": "none"}
OUTBOX = STACK | {"broker": SHOWN}
WHERE = "the `toolq up` recorded in .toolq/state.json"

# (recorded mode, this process's settings, publishes) -> what it runs on, or its refusal
MODE_TABLE: list[tuple[dict[str, Any] | None, dict[str, Any], bool, dict[str, Any] | str]] = [
    # unset here: the stack's
    (STACK, {}, True, {"cells": 256, "durability": "none", "broker_url": None}),
    (STACK | {"cells": None}, {}, True, {"cells": None}),
    (OUTBOX | {"cluster": True}, {"broker_url": BROKER}, True, {"cluster": True, "cells": 256}),
    # set here, and the same: fine; durability is this process's own choice
    (STACK, {"cells": 256, "durability": "fsync"}, True, {"cells": 256, "durability": "fsync"}),
    (OUTBOX, {"broker_url": BROKER.replace("s3cret", "other")}, True, {"cells": 256}),
    # set here, and otherwise: refused
    (
        STACK,
        {"cells": 16},
        False,
        f"this command's TOOLQ_CELLS=16 disagrees with {WHERE} (TOOLQ_CELLS=256): "
        "set TOOLQ_CELLS=256",
    ),
    (
        STACK | {"cells": None},
        {"cells": 16},
        True,
        f"this command's TOOLQ_CELLS=16 disagrees with {WHERE} (TOOLQ_CELLS=(unset)): "
        "unset TOOLQ_CELLS",
    ),
    (
        STACK,
        {"prefix": "other"},
        False,
        f"this command's TOOLQ_PREFIX=other disagrees with {WHERE} (TOOLQ_PREFIX=toolq): "
        "set TOOLQ_PREFIX=toolq",
    ),
    # the broker: its URL (password) is not in the file
    (
        OUTBOX,
        {},
        True,
        f"{WHERE} publishes through a broker: set TOOLQ_BROKER_URL to the broker {SHOWN} "
        "(its password is not recorded)",
    ),
    (OUTBOX, {}, False, {"cells": 256, "broker_url": None}),  # reads only: fine
    (
        STACK,
        {"broker_url": BROKER},
        False,
        f"this command's TOOLQ_BROKER_URL disagrees with {WHERE}, whose ledger is its own "
        "broker: unset TOOLQ_BROKER_URL",
    ),
    (
        OUTBOX,
        {"broker_url": "amqp://guest:s3cret@elsewhere:5672//"},
        True,
        "this command's TOOLQ_BROKER_URL (amqp://guest:***@elsewhere:5672//) disagrees with "
        f"{WHERE}: set TOOLQ_BROKER_URL to the broker {SHOWN}",
    ),
    (None, {"cells": 16}, True, {"cells": 16}),  # an older toolq's file: nothing to check
]


@pytest.mark.parametrize(("mode", "given", "publishes", "expected"), MODE_TABLE)
def test_the_recorded_mode_fills_in_or_refuses(
    mode: dict[str, Any] | None,
    given: dict[str, Any],
    publishes: bool,
    expected: dict[str, Any] | str,
) -> None:
    settings = ToolqSettings(**given)
    if isinstance(expected, str):
        with pytest.raises(RequestRefused) as info:
            with_mode(settings, mode, publishes=publishes, path=".toolq")
        assert info.value.message == expected
        assert "s3cret" not in info.value.message
        return
    out = with_mode(settings, mode, publishes=publishes, path=".toolq")
    got = {k: getattr(out, k) for k in expected}
    if "broker_url" in got and got["broker_url"] is not None:
        got["broker_url"] = got["broker_url"].get_secret_value()
    assert got == expected


def test_the_mode_is_recorded_without_the_brokers_password() -> None:
    settings = ToolqSettings(cells=8, cluster=True, broker_url=BROKER)
    assert mode_of(settings) == {
        "cells": 8,
        "cluster": True,
        "prefix": "toolq",
        "broker": SHOWN,
        "durability": "fsync",
    }


def test_python_callers_take_the_recorded_mode_with_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolq import ToolQueue

    _record(tmp_path, pid=os.getpid(), mode=STACK)
    monkeypatch.setenv("TOOLQ_STATE_DIR", str(tmp_path))
    tq = ToolQueue()
    assert tq.app.cell_keys() is not None and tq.settings.cells == 256
    assert tq.app.redis_url == URL
    _record(tmp_path, pid=os.getpid(), mode=OUTBOX)
    with pytest.raises(RequestRefused, match="set TOOLQ_BROKER_URL to the broker"):
        ToolQueue().app.redis_url  # noqa: B018


def test_every_command_refuses_a_mode_it_disagrees_with_in_one_line(tmp_path: Path) -> None:
    _record(tmp_path, pid=os.getpid(), mode=STACK)
    # A process each, as a user runs them: in this one the example app may be imported
    # already, with the settings of an earlier test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLQ_")}
    for args in (["show", "run_1/step_1"], ["status"], ["submit", "echo", "--args", "{}"]):
        result = subprocess.run(
            [sys.executable, "-m", "toolq.edges.cli", *args, "--state-dir", str(tmp_path)],
            env={**env, "TOOLQ_CELLS": "16"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "TOOLQ_CELLS=16 disagrees with the `toolq up`" in lines[0]
