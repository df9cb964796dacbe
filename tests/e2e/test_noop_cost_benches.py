"""The no-op cost benches of issue 29 at toy size (README "Measured", decision 0020):
``python -m bench.noop_cost`` (where each 0.1 ms of a no-op call goes, per process) and
``python -m bench.lean_ceiling`` (a bench-only consumer of toolq's own against
``-P asyncio``). Each must finish every call it submitted, leave nothing
unacknowledged, and report a CPU figure for every process it names; the figures' sizes
are the benches' business (no timed assertion here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_bench

CALLS = 50


def _bench(module: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    argv = (module, "--rounds", "1", "--calls", str(CALLS), *args)
    proc = run_bench(tmp_path, *argv, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = {"bench.noop_cost": "noop-cost", "bench.lean_ceiling": "lean-ceiling"}[module]
    if "--backlog" in args:
        name += "-backlog"
    data: dict[str, Any] = json.loads((tmp_path / "results" / f"{name}.json").read_text())
    assert (tmp_path / "RESULTS.md").read_text().strip()  # its table was written
    return data


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_noop_cost_accounts_every_process_of_a_round(tmp_path: Path) -> None:
    data = _bench("bench.noop_cost", tmp_path)

    (row,) = data["rows"]
    assert row["failed"] == 0 and row["rate"] > 0
    for part in ("submitter", "worker", "server"):
        assert row[part] > 0, (part, row)
    assert row["total"] == pytest.approx(row["submitter"] + row["worker"] + row["server"])
    # the submitter's pieces are inside tq.submit, which is inside the submitter's CPU
    assert 0 < row["  Ledger.submit (the SUBMIT script call)"] < row["tq.submit"]
    assert row["cmd fcall"][0] == pytest.approx(3.0)  # SUBMIT, CLAIM, APPLY a call


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backlog", [False, True], ids=["streamed", "backlog"])
def test_lean_ceiling_runs_both_consumers_and_leaves_nothing_unacked(
    tmp_path: Path, backlog: bool
) -> None:
    data = _bench("bench.lean_ceiling", tmp_path, *(["--backlog"] if backlog else []))

    rows = data["rows"]
    assert {r["variant"] for r in rows} >= {"asyncio", "prototype"}
    for r in rows:
        assert r["failed"] == 0 and r["unacked_after"] == 0 and r["worker_alive"], r
        assert r["rate"] > 0 and r["worker"] > 0, r
        assert r["fcall a call"] == pytest.approx(3.0), r
