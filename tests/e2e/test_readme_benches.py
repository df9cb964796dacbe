"""The single-server benches README's "Measured" table and docs/ show, run at toy size:
``python -m bench server``, ``python -m bench latency`` (after ``python -m bench
throughput``, whose rate it runs at half of), ``python -m bench.durability``,
``python -m bench.relay_bench``, ``python -m bench.outage_resume``,
``python -m bench.server_ablation`` and ``python -m bench.lists_bench`` (docs are run:
a command a page shows is executed by a test). Each writes to ``BENCH_OUT`` in
tmp_path; the test asserts what the bench produced (every call finished without an
error, the rows the table is made of, counts the bench decides), never its timings.

Left out here: ``python -m bench.outage_resume``'s broker run (RabbitMQ booted twice,
~16 s more; tests/e2e/test_outage_chaos.py takes RabbitMQ away and back), so the
ledger run alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.server_ablation import VARIANTS
from tests.helpers import run_bench

HARNESS_TIMEOUT_S = 180


def _run(tmp_path: Path, *argv: str, ok: bool = True) -> str:
    """``python -m ARGV`` with its output in tmp_path; its stdout (and stderr) tail."""
    proc = run_bench(tmp_path, *argv, timeout=HARNESS_TIMEOUT_S)
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (proc.returncode == 0) == ok, report
    return report if not ok else proc.stdout


def _results(tmp_path: Path, name: str) -> Any:
    return json.loads((tmp_path / "results" / f"{name}.json").read_text())


def _section(tmp_path: Path, name: str) -> str:
    """The bench's section of BENCH_OUT/RESULTS.md (bench.report's markers)."""
    text = (tmp_path / "RESULTS.md").read_text()
    found = re.search(f"<!-- bench:{name} -->\n(.*?)<!-- /bench:{name} -->", text, re.S)
    assert found, f"no {name} section in RESULTS.md"
    return found.group(1)


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_bench_server_counts_both_sides_and_one_script_call_per_step(tmp_path: Path) -> None:
    # Given toolq and bare Celery side by side on one embedded Valkey, prefork only
    # When 50 calls a side go through one round
    _run(tmp_path, "bench", "server", "--server-calls", "50", "--server-rounds", "1",
         "--pools", "prefork")  # fmt: skip
    res = _results(tmp_path, "server")
    # Then every call of each side finished, and the server's counters were read for it
    (pool,) = res["pools"].values()
    for side in ("toolq", "bare"):
        (run,) = pool["runs"][side]
        assert run["errors"] == 0 and run["rate"] > 0, (side, run)
        assert run["server_cpu_us"] > 0 and run["commands"] > 0, (side, run)
    # ... and toolq's per-script part ran each step, one FCALL a call for each script
    steps = res["scripts"]["steps"]
    assert list(steps) == ["submit", "claim", "record (success)", "wait (settled)"]
    for step in ("submit", "claim", "record (success)"):
        assert steps[step]["by_command"]["fcall"][0] == pytest.approx(1.0), step
    assert "fcall" not in steps["wait (settled)"]["by_command"]
    assert "**toolq / bare**" in _section(tmp_path, "server")


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S * 3 + 30)
def test_bench_latency_runs_at_half_the_stored_throughput(tmp_path: Path) -> None:
    # Given no stored throughput run: latency says what to run first
    assert "run `python -m bench throughput` first" in _run(tmp_path, "bench", "latency", ok=False)
    # When throughput runs at toy size (prefork, the pool latency reads), then latency
    _run(tmp_path, "bench", "throughput", "--calls", "50", "--repeats", "1", "--pools", "prefork")
    _run(tmp_path, "bench", "latency", "--latency-seconds", "1", "--latency-repeats", "1")
    # Then both sides finished every call of both runs
    runs = _results(tmp_path, "throughput")["pools"]["prefork -c 2"]
    for side in ("toolq", "bare"):
        (run,) = runs[side]
        assert run["errors"] == 0 and run["failures"] == 0 and run["rate"] > 0, (side, run)
    lat = _results(tmp_path, "latency")
    for side in ("toolq", "bare"):
        (run,) = lat["runs"][side]
        assert run["errors"] == 0 and run["achieved"] > 0 and run["p99_ms"] > 0, (side, run)
    # ... at half the lower of the two stored rates
    assert lat["rate"] == pytest.approx(min(runs[s][0]["rate"] for s in ("toolq", "bare")) / 2)
    assert "**toolq - bare**" in _section(tmp_path, "latency")
    assert "bare" in _section(tmp_path, "throughput")


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_durability_runs_every_arm_and_only_the_default_waits_for_the_aof(
    tmp_path: Path,
) -> None:
    # Given the three arms (everysec and always without waiting, always with the default)
    # When 50 calls a round, one round, and 1 s of latency at half load run on each
    _run(tmp_path, "bench.durability", "--calls", "50", "--repeats", "1",
         "--latency-seconds", "1")  # fmt: skip
    res = _results(tmp_path, "durability")
    # Then the probe timed both appendfsync settings
    assert set(res["probe"]) == {"always", "everysec"}
    assert all(v > 0 for p in res["probe"].values() for v in p.values()), res["probe"]
    # ... every arm finished every call of both loads
    arms = res["arms"]
    assert len(arms) == 3, list(arms)
    for label, arm in arms.items():
        ((run,), (lat,)) = arm["runs"], arm["latency"]
        assert run["errors"] == 0 and run["rate"] > 0 and run["server_cpu_ms_per_call"] > 0, label
        assert lat["errors"] == 0 and lat["p99_ms"] > 0, label
        # ... and WAITAOF was called by the default arm only (its claims and submits)
        assert (run["waitaof_per_call"] > 0) == label.endswith("(default)"), (label, run)
    section = _section(tmp_path, "durability")
    assert all(f"| {label} |" in section for label in arms), section


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_relay_bench_runs_inline_and_outbox_without_an_error(tmp_path: Path) -> None:
    # Given inline mode and outbox mode (a second Valkey as broker, one relay)
    # When each takes 50 calls closed loop and 1 s at 20 calls/s open loop
    _run(tmp_path, "bench.relay_bench", "--calls", "50", "--rounds", "1", "--rate", "20",
         "--seconds", "1")  # fmt: skip
    res = _results(tmp_path, "relay")
    # Then every call of both finished, and only outbox mode had a relay to spend CPU
    assert set(res) == {"inline", "outbox"}
    for mode, (run,) in res.items():
        assert run["errors"] == 0 and run["rate"] > 0 and run["p99"] > 0, (mode, run)
        assert (run["relay_cpu_ms"] > 0) == (mode == "outbox"), (mode, run)
    section = _section(tmp_path, "relay")
    assert "| inline |" in section and "| outbox |" in section, section


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_outage_resume_completes_a_call_after_the_ledger_returns(tmp_path: Path) -> None:
    # Given a worker and a scheduler on the ledger's server
    # When the server is SIGKILLed, kept down 1 s and started again
    _run(tmp_path, "bench.outage_resume", "--only", "ledger", "--ledger-down", "1")
    # Then the call submitted once it answered succeeded, and no process was replaced
    (res,) = _results(tmp_path, "outage-resume")
    assert res["dependency"] == "ledger" and res["down_s"] == 1.0
    assert res["ok"] is True, res
    assert res["alive"] == {"outage-worker": True, "outage-scheduler": True}, res
    assert isinstance(res["resume_s"], float), res


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_server_ablation_runs_every_variant_and_each_drops_commands(tmp_path: Path) -> None:
    # Given the shipped library and each variant with one piece of per-call state cut
    # When 20 calls of each run through submit, claim, record and wait, one round
    _run(tmp_path, "bench.server_ablation", "--calls", "20", "--rounds", "1")
    res = _results(tmp_path, "server-ablation")
    variants = {v["name"]: v["runs"] for v in res["variants"]}
    # Then every variant ran, loaded under a library name of its own
    assert list(variants) == [v.name for v in VARIANTS], list(variants)
    assert len({runs[0]["library"] for runs in variants.values()}) == len(variants)
    for name, (run,) in variants.items():
        assert run["server_cpu_us"] > 0 and run["fcall_us"] > 0, (name, run)
        assert list(run["steps"]) == ["submit", "claim", "record (success)", "wait (settled)"]
    # ... and the variant that cuts everything runs fewer commands than the baseline
    assert variants["all of the above"][0]["commands"] < variants["baseline"][0]["commands"]


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_lists_bench_pages_every_case_of_a_filled_ledger(tmp_path: Path) -> None:
    # Given a ledger filled with 2,000 operations in the bench's mix of states
    # When each list case is timed once
    out = _run(tmp_path, "bench.lists_bench", "--size", "2000", "--runs", "1")
    # Then it filled them all and printed a row for each of its 17 cases
    assert "2,000 operations filled" in out, out
    rows = dict(re.findall(r"^  (.+?)\s+median\s+[\d.]+ ms\s+max\s+[\d.]+ ms\s+(.*)$", out, re.M))
    assert len(rows) == 17, out
    # ... with the counts its mix decides (70 % succeeded, 5 % waiting_retry, 2 % escalated)
    assert rows["every state, first page"].startswith("50 rows, total 2000"), rows
    assert rows["succeeded (70%), first page"].startswith("50 rows, total 1400"), rows
    assert rows["waiting_retry, first page"].startswith("50 rows, total 100"), rows
    assert rows["escalated, limit 500"].startswith("40 rows, total 40"), rows
    assert rows["waiting_retry, code (absent)"].startswith("0 rows"), rows
