"""The Prometheus endpoint, served from a real ledger after a short scheduler run."""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from tests.helpers import (
    free_port,
    start_scheduler,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.conftest import APP
from toolq.client.queue import ToolQueue
from toolq.core.errors import ToolqError
from toolq.core.states import State
from toolq.core.tools import CallContext
from toolq.decisions.recovery.transition import Transition
from toolq.edges.metrics import METRICS_HOST_ENV, observe_tick, start_metrics_server
from toolq.services.scheduler.service import Scheduler


class Invoice(BaseModel):
    amount: int


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    queue = ToolQueue(redis_url=redis_url)

    @queue.tool(writes=True)
    def create_invoice(args: Invoice, ctx: CallContext) -> dict[str, int]:
        return {"amount": args.amount}

    yield queue
    queue.close()


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def _short_run(tq: ToolQueue) -> None:
    """Three invoices wait to retry, due now; a scheduler dispatches them and stops."""
    now_ms = int(tq.clock() * 1000)
    for i in range(3):
        ref = f"inv/{i}"
        tq.submit("create_invoice", {"amount": i}, operation_ref=ref)
        assert tq.ledger.claim(ref, 1, "worker-1", now_ms, 15_000).outcome == "claimed"
        t = Transition(
            ref=ref, states=(State.RUNNING,), to=State.WAITING_RETRY, by="test", due_ms=now_ms
        )
        assert tq.ledger.apply_one(t, now_ms) == "ok"
    dispatched = threading.Event()

    def on_tick(stats: object) -> None:
        observe_tick(stats)  # type: ignore[arg-type]
        if tq.ledger.stats().get("create_invoice|dispatched", 0) >= 3:
            dispatched.set()

    sched = Scheduler(tq.app, on_tick=on_tick)
    runner = threading.Thread(target=sched.run, daemon=True)
    runner.start()
    try:
        assert dispatched.wait(20), "the scheduler did not dispatch the due retries"
    finally:
        sched.stop()
        runner.join(timeout=10)
    sched.heartbeat()  # a live scheduler, as a running one would show
    tq.submit("create_invoice", {"amount": 9}, operation_ref="inv/9")


def _recovered(tool: str, state: str) -> float:
    """How many operations this process saw leave ``state`` (the histogram's count)."""
    labels = {"tool": tool, "state": state}
    return REGISTRY.get_sample_value("toolq_pending_recovery_seconds_count", labels) or 0.0


def test_the_endpoint_serves_the_named_series_after_a_short_run(tq: ToolQueue) -> None:
    # The per-process histogram outlives a test: count from what it held before.
    before = _recovered("create_invoice", "waiting_retry")
    server = start_metrics_server(0, tq, role="scheduler")
    try:
        _short_run(tq)
        text = _scrape(server.url)
    finally:
        server.shutdown()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "toolq_operations",
        "toolq_pending_recovery_oldest_seconds",
        "toolq_attempts",
        "toolq_verification_verdicts",
        "toolq_duplicates_prevented",
        "toolq_escalations",
        "toolq_pending_recovery_seconds",
        "toolq_scheduler_dispatch_lag_seconds",
        "toolq_queue_messages",
        "toolq_queue_unacked_messages",
        "toolq_scheduler_backlog",
        "toolq_schedulers_live",
        "toolq_ledger_up",
        "toolq_process_info",
    ):
        assert name in families, name
    for series in (
        'toolq_attempts_total{tool="create_invoice"} 7.0',  # 3 + 3 retries + inv/9
        'toolq_operations{state="queued",tool="create_invoice"} 4.0',
        'toolq_verification_verdicts_total{tool="create_invoice",verdict="found"} 0.0',
        'toolq_duplicates_prevented_total{tool="create_invoice"} 0.0',
        'toolq_escalations_total{tool="create_invoice"} 0.0',
        'toolq_dispatches_total{kind="dispatch",tool="create_invoice"} 3.0',
        'toolq_queue_messages{queue="toolq.calls"} 7.0',
        "toolq_ledger_up 1.0",
        "toolq_schedulers_live 1.0",
        'toolq_process_info{role="scheduler"',
        'toolq_scheduler_dispatch_lag_seconds_bucket{le="+Inf"}',
    ):
        assert series in text, series
    # The scheduler's batch moved the three retries out of waiting_retry, and said so.
    recovered = next(
        s.value
        for s in families["toolq_pending_recovery_seconds"].samples
        if s.name.endswith("_count")
        and s.labels == {"tool": "create_invoice", "state": "waiting_retry"}
    )
    assert recovered == before + 3
    lag = families["toolq_scheduler_dispatch_lag_seconds"]
    count = next(s.value for s in lag.samples if s.name.endswith("_count"))
    assert count >= 3


def test_it_binds_to_loopback_unless_told_otherwise(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(METRICS_HOST_ENV, raising=False)
    server = start_metrics_server(0, tq, role="worker")
    try:
        assert server.host == "127.0.0.1"
        assert "toolq_ledger_up 1.0" in _scrape(server.url)
    finally:
        server.shutdown()


def test_a_port_in_use_is_one_clear_error(tq: ToolQueue) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        with pytest.raises(ToolqError, match=rf"cannot serve metrics on 127.0.0.1:{port}"):
            start_metrics_server(port, tq, role="worker")


def test_scrapes_follow_the_ledger(tq: ToolQueue) -> None:
    server = start_metrics_server(0, tq, role="up")
    try:
        before = _scrape(server.url)
        tq.submit("create_invoice", {"amount": 1}, operation_ref="inv/1")
        after = _scrape(server.url)
    finally:
        server.shutdown()

    assert 'toolq_operations{state="queued"' not in before
    assert 'toolq_operations{state="queued",tool="create_invoice"} 1.0' in after


def _pending_count(url: str, tool: str, state: str) -> float | None:
    """The count of ``toolq_pending_recovery_seconds`` a process serves; None if it serves none."""
    try:
        text = _scrape(url)
    except OSError:  # not listening yet
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "toolq_pending_recovery_seconds":
            for s in family.samples:
                if s.name.endswith("_count") and s.labels == {"tool": tool, "state": state}:
                    return s.value
    return 0.0


def test_worker_and_scheduler_processes_serve_what_left_pending_recovery(
    rt: ToolQueue, module_redis_url: str
) -> None:
    # Given a worker and a scheduler serving metrics, the worker on threads so its
    # tasks run in the process that serves them (a prefork child's would not show)
    worker_port, scheduler_port = free_port(), free_port()
    procs = [
        start_worker(
            APP, module_redis_url, pool="threads", extra_args=["--metrics-port", str(worker_port)]
        ),
        start_scheduler(APP, module_redis_url, extra_args=["--metrics-port", str(scheduler_port)]),
    ]
    try:
        # When one write is rate-limited twice (the scheduler brings it back from
        # waiting_retry each time) and another loses its reply after committing (the
        # worker's verifier settles it from verifying)
        retried = rt.submit("pay", {"mode": "rate_limited"}).operation_ref
        verified = rt.submit("pay", {"mode": "lost_reply"}).operation_ref
        assert rt.wait(retried, timeout=30).ok
        assert rt.wait(verified, timeout=30).ok

        # Then each process serves what it moved out of pending recovery, and only that
        scheduler_url = f"http://127.0.0.1:{scheduler_port}/metrics"
        worker_url = f"http://127.0.0.1:{worker_port}/metrics"
        assert wait_until(lambda: _pending_count(scheduler_url, "pay", "waiting_retry") == 2, 10)
        assert wait_until(lambda: _pending_count(worker_url, "pay", "verifying") == 1, 10)
        assert _pending_count(scheduler_url, "pay", "verifying") == 0
        assert _pending_count(worker_url, "pay", "waiting_retry") == 0
    finally:
        stop_processes(procs)
