"""The Valkey Cluster benches docs/cells.md and README show (issue 18), at toy size.

``python -m bench.cluster_chaos``: bench.chaos's harness on a cluster of 3 primaries
with a replica each (a cluster of its own, started by the bench: tests/cluster.py),
30 operations and one kill, with its three events (a primary SIGKILLed and revived,
a cell's slot migrated); asserted as tests/e2e/test_chaos.py asserts the single
server's run: nothing doubled, lost or stuck, and no outbox entry left.

``python -m bench.cluster_bench``: only its command line here. Its smallest run
(``--calls 20 --rounds 1 --idle 0.2``) is four deployments in turn (inline, 1, 2 and 3
primaries), each with fresh processes, a 3-s settle and a 200-call warm-up: 38 s on
2 cores, past this suite's budget for it. Run it by hand when bench/cluster_bench.py
changes.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_bench

HARNESS_TIMEOUT_S = 240


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_bench(tmp_path, *argv, timeout=HARNESS_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 30)
def test_cluster_chaos_fails_over_migrates_and_settles_every_operation_once(
    tmp_path: Path,
) -> None:
    # Given the ledger in 256 cells on 3 primaries with a replica each, outbox mode
    # When 30 operations run while a process is SIGKILLed, a primary is SIGKILLed (its
    # replica takes over) and revived, and a cell's slot moves to another primary
    proc = _run(tmp_path, "bench.cluster_chaos", "--ops", "30", "--kills", "1",
                "--interval", "1")  # fmt: skip
    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "results" / "chaos-cluster.json").read_text())
    # Then the three events happened
    events = res["cluster"]
    assert events.get("failover_s") is not None and events.get("revived") is True, report
    assert events.get("migrated_cell") is not None, report
    # ... every operation settled, once, the ledger agrees with the provider, and the
    # outboxes are empty
    assert res["submitted"] == 30 and sum(res["by_state"].values()) == 30, report
    assert sum(res["kills"].values()) >= 1, report
    assert res["duplicates"] == {}, report
    assert res["stuck"] == {}, report
    assert res["vanished"] == [], report
    assert res["lost"] == [], report
    assert res["phantom"] == {}, report
    assert res["mismatched"] == [], report
    assert events["outbox_left"] == 0, report
    assert proc.returncode == 0, report
    section = (tmp_path / "RESULTS.md").read_text()
    assert re.search(r"<!-- bench:chaos-cluster -->\n## Chaos on a Valkey Cluster", section)


def test_cluster_bench_takes_the_options_docs_show(tmp_path: Path) -> None:
    # docs/cells.md: `python -m bench.cluster_bench --calls 1000 --rounds 2` (and --balance)
    proc = _run(tmp_path, "bench.cluster_bench", "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for option in ("--calls", "--rounds", "--idle", "--balance"):
        assert re.search(rf"(?<![\w-]){option}(?![\w-])", proc.stdout), (option, proc.stdout)
