"""A call's record meets the ledger's server away (the outage runs of issue 25): the
tool ran, its outcome cannot be written within the record's patience.

On a prefork and an asyncio-pool worker, with a server of this module's own killed
while four calls of a write are running and started again once each record gave up:

* the worker says it on one WARNING line a call (Celery's requeue line), no
  traceback, no ERROR ("raised unexpected: ConnectionError" before), and no kombu
  "Requeuing undeliverable message" line a message fetched as the consumer reconnected;
* the lease renewals say once a process that they fail and once that they are back,
  though no call is held any more when the server returns, and their lines name no
  operation (they are about none);
* nothing is lost or run twice: each call ends ``succeeded`` (its lease ran out, the
  verifier found the write), each tool ran once, the worker runs on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port, start_toolq, stop_processes, wait_until
from tests.integration.apps import outage_app
from toolq import ToolQueue
from toolq.adapters.embedded import EmbeddedServer, url_for_db

APP = "tests.integration.apps.outage_app:tq"
CALLS = 4
#: The record's patience in the worker (``worker.record_patience_s``, 60 s by default):
#: the outage outlasts it.
PATIENCE_S = "4"
TERMINAL = {"succeeded", "failed", "escalated", "cancelled"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path / "valkey", port=free_port(), appendonly=True)
    yield s
    s.stop()


def _said(path: Path) -> str:
    return path.read_text(errors="replace")


@pytest.mark.parametrize("pool", ["prefork", "asyncio"])
def test_a_record_the_server_does_not_take_is_said_once_and_settled_without_a_traceback(
    server: EmbeddedServer, tmp_path: Path, pool: str
) -> None:
    server.start()
    url = url_for_db(server.url, 0)
    provider = tmp_path / "provider"
    env = {
        "TOOLQ_REDIS_URL": url,
        "TOOLQ_TEST_PROVIDER_DIR": str(provider),
        "TOOLQ_WORKER__RECORD_PATIENCE_S": PATIENCE_S,
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as f:  # the worker's own level: WARNING, quiet by default
        worker = start_toolq(
            ["worker", "--app", APP, "--pool", pool, "-c", "4"], env=env, stderr=f.fileno()
        )
    scheduler = start_toolq(["scheduler", "--app", APP, "--loglevel", "WARNING"], env=env)
    tq: ToolQueue = outage_app.tq
    tq.configure(redis_url=url)
    try:
        # Given four writes running (each waits for the test's word to commit)
        refs = [tq.submit("hold", {}, operation_ref=f"rec/{i}").operation_ref for i in range(CALLS)]
        started = provider / "started"
        assert wait_until(lambda: len(list(started.glob("*"))) == CALLS, timeout=60)

        # When the server goes away, the tools commit, and every record gives up
        server.kill()
        (provider / "go").touch()
        assert wait_until(lambda: _said(log).count("did not take the record") == CALLS, 120)
        assert worker.poll() is None
        server.start()

        # Then every call ends, succeeded (its write verified), its tool run once
        def ended() -> bool:
            return all(tq.app.ledger.fields(r, "state")["state"] in TERMINAL for r in refs)

        assert wait_until(ended, timeout=120, interval=0.5)
        states = {r: tq.app.ledger.fields(r, "state")["state"] for r in refs}
        assert set(states.values()) == {"succeeded"}, states
        effects = {p.name: p.read_text().split() for p in (provider / "effects").glob("*")}
        assert effects == {r.replace("/", "_"): ["1"] for r in refs}

        # and the renewals said they are back, though nothing was held by then: each
        # process that said they fail (one, or each pool child that held a call)
        def all_back() -> bool:
            lines = _said(log).splitlines()
            failing = _by_process(lines, "lease renewals failing")
            return bool(failing) and set(_by_process(lines, "lease renewals back")) >= set(failing)

        assert wait_until(all_back, timeout=30)
        assert worker.poll() is None
    finally:
        tq.close()
        stop_processes((worker, scheduler), timeout=10)
    said = _said(log)
    assert "Traceback" not in said, said[-4000:]
    assert "raised unexpected" not in said and "ERROR" not in said, said[-4000:]
    # a fetch read after the consumer reconnected goes back without kombu's line a message
    assert "Requeuing undeliverable" not in said, said[-4000:]
    lines = said.splitlines()
    records = [x for x in lines if "did not take the record" in x]
    assert len(records) == CALLS, records  # one line a call
    assert all("WARNING" in x and "requeued: rec/" in x for x in records), records
    # after the patience the worker's settings gave it (not the 60 s default)
    assert all(f"did not take the record within {PATIENCE_S} s" in x for x in records), records
    # once a process each way: one process (asyncio) or one a pool child (prefork)
    failing = _by_process(lines, "lease renewals failing")
    back = _by_process(lines, "lease renewals back")
    assert failing and all(n == 1 for n in failing.values()), failing
    assert set(back) == set(failing) and all(n == 1 for n in back.values()), back
    keeper = [x for x in lines if "lease renewals" in x]
    assert not [x for x in keeper if "operation_ref=" in x], keeper


def _by_process(lines: list[str], what: str) -> dict[str, int]:
    """How many times each process (Celery's ``WARNING/ForkPoolWorker-1``) said ``what``."""
    counts: dict[str, int] = {}
    for line in lines:
        if what in line:
            m = re.search(r"WARNING/([^\]]+)\]", line)
            who = m.group(1) if m else "?"
            counts[who] = counts.get(who, 0) + 1
    return counts
