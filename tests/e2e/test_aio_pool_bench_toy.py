"""The asyncio-pool bench (issue 29) at a toy size, toolq beside saq and arq in the same
interleaved round: ``python -m bench.aio_pool_bench --scenarios …`` queues 20 calls of
an ``async def`` function awaiting 0.2 s (``sleep``) or a GET to the bench's local HTTP
provider answering after 0.2 s through an ``httpx.AsyncClient`` per call (``http``: the
same tool body for every system, :mod:`bench.peers.http_call`), then starts ONE worker
process at concurrency 20 (toolq's ``-P asyncio`` and Celery's threads pool; saq; arq).
Every call must complete, all 20 at once inside the function (counted in the worker's
memory), and the wall read from each system's own stamps must hold the 0.2 s awaited.

saq runs with its first sweep held off (``saq-nosweep``, ``saq-http``): at its defaults
the sweep at worker start aborts jobs just dequeued (:func:`bench.aio_pool_peers.saq_run`),
which the bench reports, not an invariant. arq needs its own venv (``make .venv-arq``),
with httpx in it for ``arq-http``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from bench.peers.arq_peer import arq_python
from tests.helpers import run_bench

JOBS = 20
SECONDS = 0.2
TOOLQ = ("sleep", "http", "threads-http")
PEERS = ("saq-nosweep", "arq", "saq-http", "arq-http")
#: Each scenario's row label, as the bench renders it.
LABELS = {
    "sleep": f"sleep, asyncio -c {JOBS}",
    "http": f"http, asyncio -c {JOBS}",
    "threads-http": f"http, threads -c {JOBS}",
    "saq-nosweep": f"sleep, saq concurrency={JOBS}, first sweep held off",
    "arq": f"sleep, arq max_jobs={JOBS}",
    "saq-http": f"http, saq concurrency={JOBS}, first sweep held off",
    "arq-http": f"http, arq max_jobs={JOBS}",
}
NO_SAQ = pytest.mark.skipif(
    importlib.util.find_spec("saq") is None, reason="saq not installed (bench extra)"
)
NO_ARQ = pytest.mark.skipif(arq_python() is None, reason="no arq venv: make .venv-arq")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """One toy run of every scenario above, interleaved in one round."""
    out = tmp_path_factory.mktemp("aio-bench")
    scenarios = list(TOOLQ)
    if importlib.util.find_spec("saq") is not None:
        scenarios += ["saq-nosweep", "saq-http"]
    if arq_python() is not None:
        scenarios += ["arq", "arq-http"]
    proc = run_bench(
        out, "bench.aio_pool_bench", "--scenarios", ",".join(scenarios),
        "--calls", str(JOBS), "--seconds", str(SECONDS), "--repeats", "1", timeout=280,
    )  # fmt: skip
    report = proc.stdout[-4000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    runs: dict[str, Any] = {}
    for name in ("aio-pool", "aio-pool-peers"):
        res = json.loads((out / "results" / f"{name}.json").read_text())
        assert res.get("missing", []) == [], report
        runs.update(res["runs"])
    return runs, report, out


@pytest.mark.parametrize(
    "scenario",
    [*TOOLQ, *(pytest.param(s, marks=NO_ARQ if "arq" in s else NO_SAQ) for s in PEERS)],
)
def test_every_call_is_held_in_flight_on_one_worker_process(
    bench_run: tuple[dict[str, Any], str, Path], scenario: str
) -> None:
    # Given JOBS calls queued first, then one worker process at concurrency JOBS
    # When the asyncio-pool bench runs the scenario at toy size
    runs, report, _ = bench_run
    (run,) = runs[LABELS[scenario]]
    # Then every call completed, all of them inside the function at once
    assert run["ok"] and run["succeeded"] == JOBS, report
    if scenario in TOOLQ or run["claims_s"] < SECONDS:
        assert run["max_in_flight"] == JOBS, report
    else:
        # A peer that took its jobs more slowly than one call lasts (arq on a loaded
        # machine: 0.36 s for 20) lets its first calls end before its last begin
        assert 1 <= run["max_in_flight"] <= JOBS, report
    # And the wall, read from the system's own stamps, spans at least one call's await
    assert run["wall_s"] >= SECONDS, report
    assert run["rss_mb"] > 0 and run["worker_cpu_s"] > 0, report


@NO_SAQ
def test_the_peers_section_shows_toolqs_rows_from_the_same_rounds(
    bench_run: tuple[dict[str, Any], str, Path],
) -> None:
    # Given toolq's and the peers' scenarios run in the same round
    _, report, out = bench_run
    text = (out / "RESULTS.md").read_text()
    peers = text[text.index("<!-- bench:aio-pool-peers -->") :]
    # Then the peers' section lists toolq's rows of that round beside saq's
    assert "toolq's rows are from the same rounds" in peers, report
    assert f"| {LABELS['http']} (the table above) |" in peers, report
    assert f"| {LABELS['saq-http']} |" in peers, report
