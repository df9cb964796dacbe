"""Commands run beside a `toolq up` take the mode it recorded, and a process on another
number of cells than the ledger's is refused: never an empty answer (toolq.adapters.stack_state)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from toolq import ToolQueue
from toolq.adapters.stack_state import mode_of, owner, write_state
from toolq.core.settings import ToolqSettings
from toolq.edges.cli import main

CELLS = 4
APP = "toolq.examples.invoices:tq"
ENV = ("TOOLQ_REDIS_URL", "TOOLQ_STATE_DIR", "TOOLQ_APP", "TOOLQ_CELLS", "TOOLQ_BROKER_URL")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    # The commands run in this process: the example app they load is this module's,
    # and a recorded mode it adopted must not reach the next test.
    from toolq.examples.invoices import tq

    settings = tq.app.settings
    yield
    tq.app.adopt(settings)


@pytest.fixture
def in_cells(redis_url: str) -> Iterator[str]:
    """A ledger in CELLS cells holding one operation of `create_invoice`."""
    tq = ToolQueue(redis_url, settings=ToolqSettings(cells=CELLS, durability="none"))
    tq.tool(name="create_invoice")(lambda: None)
    tq.submit("create_invoice", {}, operation_ref="mode/1")
    tq.close()
    yield redis_url


def _status(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["status", "--json", "--no-workers", *args], env=env)


def test_status_beside_a_stack_in_cells_reads_its_cells(tmp_path: Path, in_cells: str) -> None:
    # Given the state file of a stack in 4 cells, and no TOOLQ_CELLS here
    mode = mode_of(ToolqSettings(cells=CELLS, durability="none"))
    write_state({"redis_url": in_cells, "app": APP, **owner(), "mode": mode}, tmp_path)
    # When status (and show) run in its directory
    res = _status("--state-dir", str(tmp_path))
    shown = CliRunner().invoke(main, ["show", "mode/1", "--json", "--state-dir", str(tmp_path)])
    # Then they read the operation in its cell
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["tools"]["create_invoice"]["states"]["queued"] == 1
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["state"] == "queued"
    # And with the app loaded too
    res = _status("--app", APP, "--state-dir", str(tmp_path))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("app", [[], ["--app", APP]])
def test_status_without_cells_on_a_ledger_in_cells_is_refused(
    tmp_path: Path, in_cells: str, app: list[str]
) -> None:
    # No state file: the URL given, and no TOOLQ_CELLS
    res = _status("--redis-url", in_cells, "--state-dir", str(tmp_path), *app)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert f"this ledger lives in {CELLS} cells" in lines[0]
    assert f"set TOOLQ_CELLS={CELLS}" in lines[0]
    assert "no operations" not in res.output


def test_status_with_the_right_cells_still_answers(in_cells: str) -> None:
    res = _status("--redis-url", in_cells, env={"TOOLQ_CELLS": str(CELLS)})
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["tools"]["create_invoice"]["states"]["queued"] == 1
    assert os.environ.get("TOOLQ_CELLS") is None
