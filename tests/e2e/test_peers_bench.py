"""The peers bench (issue 29) at CI size: toolq, bare Celery and huey on one Valkey.

The harness is :mod:`bench.peers_bench` (``python -m bench peers`` / ``crash`` run it
at full size, every system). Here, with ``--quick``: the no-op and 100 ms loads
through three systems, every task must complete; then the crash comparison,
whose counts must be reported for every system and must be 0 lost / 0 doubled
for toolq (an invariant, not a timing). Bare Celery at its defaults (early
acks) may lose writes; huey (no acknowledgement) too: reported, not asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_bench

SYSTEMS = "toolq,celery,huey"


def _bench(
    tmp_path: Path, *args: str, timeout: float, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    argv = ("bench", *args, "--systems", SYSTEMS, "--quick")
    proc = run_bench(tmp_path, *argv, timeout=timeout, env=env)
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    raw = tmp_path / "results" / f"{args[0]}.json"
    assert raw.exists(), report
    return json.loads(raw.read_text()), report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_peers_quick_completes_every_task_of_every_system(tmp_path: Path) -> None:
    # Given toolq, bare Celery and huey, each with its own workers on one Valkey
    # When the no-op load and the 100 ms load run through each
    res, report = _bench(tmp_path, "peers", "--calls", "60", timeout=280)
    # Then every system completed every task, and each run has a rate and a CPU cost
    # (the I/O round's 20 sleeping tasks can cost a worker less than the one 10-ms tick
    # the kernel counts CPU in: measured, and maybe 0 there)
    for load, some_cpu in (*((m, True) for m in res["modes"].values()), (res["io"], False)):
        assert sorted(load) == sorted(SYSTEMS.split(",")), report
        for runs in load.values():
            assert [r["failed"] for r in runs] == [0] * len(runs), report
            assert all(r["rate"] > 0 for r in runs), report
            cpu = [r["cpu_ms"]["workers"] for r in runs]
            assert all(c > 0 if some_cpu else c >= 0 for c in cpu), report
    assert "| **toolq** |" in (tmp_path / "RESULTS.md").read_text(), report


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_crash_toolq_never_loses_or_doubles_a_write(tmp_path: Path) -> None:
    # Given writes to a counter that never deduplicates, in every system
    # When every worker process of each system is SIGKILLed mid-run and restarted
    # (toolq's recovery paths at shorter bounds: a 5-s lease, a lost message published
    # again after 5 s (as bench.chaos), the scheduler's sleep at most 1 s, so the smoke
    # run stops waiting 21 s after the counters stop moving instead of out the whole
    # --settle; bench.peers_bench.smoke_quiet_s reads the same settings)
    res, report = _bench(
        tmp_path, "crash", "--calls", "40", "--kills", "2", "--settle", "120", timeout=400,
        env={"TOOLQ_LEASE__SECONDS": "5", "TOOLQ_RECOVERY__UNCLAIMED_AFTER": "5",
             "TOOLQ_SCHEDULER__MAX_SLEEP": "1"},
    )  # fmt: skip
    # Then every system's counts are reported: each write is once, lost or doubled
    for name, d in res["systems"].items():
        assert d["written_once"] + d["lost"] + d["doubled"] == d["calls"] == 40, (name, report)
        assert len(d["killed_at"]) == 2, (name, report)
    # And toolq wrote every one of its writes exactly once
    toolq = res["systems"]["toolq"]
    assert (toolq["lost"], toolq["doubled"], toolq["written_once"]) == (0, 0, 40), report
