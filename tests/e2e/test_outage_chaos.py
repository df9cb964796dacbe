"""Outages at CI size (issue 25): RabbitMQ and the ledger's server go away, then the books.

The harness is :mod:`bench.outage_chaos` (``python -m bench.outage_chaos`` runs it
at full size: RabbitMQ down 20 s and 120 s, the server down 60 s, 12 kills). Here,
on one server with RabbitMQ as Celery's broker (outbox mode, two relays): about 40
operations against the example provider without deduplication, RabbitMQ SIGKILLed
for 12 s (longer than the ~8 s after which the relay exited on kombu's
OperationalError before issue 25: 4 relay exits at CI size, the only failure), the
server SIGKILLed for 15 s, one whole worker SIGKILLed. No process may exit on its
own; the resume figures are reported, not asserted. About 2 minutes, a third of it
RabbitMQ booting (a start, a graceful restart that saves its queue registry, and
the start after the SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, toolq_env
from tests.rabbit import _binary

#: The harness bounds itself (--max-seconds, --settle); this only catches a hang.
HARNESS_TIMEOUT_S = 400


@pytest.mark.slow
@pytest.mark.timeout(HARNESS_TIMEOUT_S + 60)
def test_outages_double_nothing_lose_nothing_and_no_process_exits(tmp_path: Path) -> None:
    if _binary() is None:  # as tests/rabbit.py: a failure in CI, a skip elsewhere
        why = "no rabbitmq-server (apt-get install rabbitmq-server, or TOOLQ_RABBITMQ_SERVER)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    # Given a single server, RabbitMQ as the broker and the provider with its faults
    out = tmp_path / "outage.json"
    argv = [
        sys.executable, "-m", "bench.outage_chaos",
        "--ops", "40", "--kills", "1", "--kill-kinds", "worker",
        "--outages", "rabbit:12,ledger:15", "--gap", "8", "--warmup", "5",
        "--settle", "60", "--max-seconds", "240",
        "--no-report", "--json", str(out),
    ]  # fmt: skip
    # When RabbitMQ, then the server, go away while operations are submitted
    proc = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=toolq_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=HARNESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the harness stops all it started
        stdout, _ = proc.communicate(timeout=60)
    assert out.exists(), stdout[-6000:]
    res = json.loads(out.read_text())
    report = stdout[-4000:]
    # Then every outage happened and the dependency answered again
    assert [o["name"] for o in res["outages"]] == ["rabbit:12", "ledger:15"], report
    assert all(o["back_at"] for o in res["outages"]), report
    assert res["kills"] == {"worker": 1}, report
    assert res["submitted"] >= 30, report
    # ... nothing ran twice, nothing was lost, everything settled, the books agree
    assert res["duplicates"] == {}, report
    assert res["vanished"] == [] and res["lost"] == [], report
    assert res["stuck"] == {}, report
    assert res["phantom"] == {} and res["mismatched"] == [], report
    # ... and no process exited because a dependency was away
    assert res["unexpected_exits"] == [], report
