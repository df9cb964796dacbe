"""saq and arq in the asyncio-pool bench (issue 29) at a toy size: ``python -m
bench.aio_pool_bench --scenarios …`` queues 20 jobs of an ``async def`` function
awaiting 0.2 s, then starts ONE worker process of the peer at concurrency 20; every job
must complete, all 20 at once inside the function (counted in the worker's memory),
and the wall read from the peer's own stamps must hold the 0.2 s each job awaited.

saq runs with its first sweep held off (``saq-nosweep``): at its defaults the sweep at
worker start aborts jobs just dequeued (:func:`bench.aio_pool_peers.saq_run`), which
the bench reports, not an invariant. arq needs its own venv (``make .venv-arq``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers.arq_peer import arq_python
from tests.helpers import REPO_ROOT, toolq_env

JOBS = 20
SECONDS = 0.2


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "system",
    [
        pytest.param(
            "saq-nosweep",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("saq") is None, reason="saq not installed (bench extra)"
            ),
        ),
        pytest.param(
            "arq",
            marks=pytest.mark.skipif(arq_python() is None, reason="no arq venv: make .venv-arq"),
        ),
    ],
)
def test_peer_holds_every_job_in_flight_on_one_worker_process(system: str, tmp_path: Path) -> None:
    # Given JOBS jobs queued first, then one worker process of the peer at concurrency JOBS
    # When the asyncio-pool bench runs the peer's scenario at toy size
    proc = subprocess.run(
        [sys.executable, "-m", "bench.aio_pool_bench", "--scenarios", system,
         "--calls", str(JOBS), "--seconds", str(SECONDS), "--repeats", "1"],
        cwd=REPO_ROOT,
        env=toolq_env({"BENCH_OUT": str(tmp_path), "BENCH_LOG_DIR": str(tmp_path / "logs")}),
        capture_output=True,
        text=True,
        timeout=220,
    )  # fmt: skip
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    res = json.loads((tmp_path / "results" / "aio-pool-peers.json").read_text())
    # Then every job completed, all of them inside the function at once
    (runs,) = res["runs"].values()
    (run,) = runs
    assert res["missing"] == [], report
    assert run["ok"] and run["succeeded"] == JOBS, report
    assert run["max_in_flight"] == JOBS, report
    # And the wall, read from the peer's own stamps, spans at least one job's await
    assert run["wall_s"] >= SECONDS, report
    assert run["rss_mb"] > 0 and run["worker_cpu_s"] > 0, report
    # And the section renders beside toolq's (none stored here: only the peer's row)
    assert "| sleep, " in (tmp_path / "RESULTS.md").read_text(), report
