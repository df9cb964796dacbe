"""Chaos at CI size: kills, a server restart and duplicate deliveries, then the books.

The harness is :mod:`bench.chaos` (``python -m bench chaos`` runs it at full
size: 2,000 operations, 30 kills). Here: 150 operations and 6 SIGKILLs of
workers, pool children and schedulers, one hard restart of the server (AOF,
``appendfsync always``) and copies of queued messages pushed back, against
the example provider with deduplication off, so every commit is a real side
effect.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, toolq_env


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_chaos_no_duplicate_no_lost_no_stuck_no_disagreement(tmp_path: Path) -> None:
    # Given the real system and the example provider with its faults turned up
    out = tmp_path / "chaos.json"
    # When workers, pool children and schedulers are SIGKILLed, the server is
    # restarted and messages are delivered twice, while 150 operations run
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.chaos",
            "--ops",
            "150",
            "--kills",
            "6",
            "--interval",
            "2",
            "--no-report",
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        env=toolq_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    report = proc.stdout[-3000:]
    # Then every operation settled, once, and the ledger agrees with the provider
    assert res["submitted"] == 150, report
    assert sum(res["kills"].values()) >= 6, report
    assert res["server_restarts"] == 1, report
    assert res["duplicates"] == {}, report
    assert res["stuck"] == {}, report
    assert res["lost"] == [], report
    assert res["phantom"] == {}, report
    assert res["mismatched"] == [], report
    assert proc.returncode == 0, report
