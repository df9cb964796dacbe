"""One tool call is one trace: the caller's span, the submit, every attempt, the
scheduler's moves and the verification check, across real worker and scheduler
processes (each writes its spans to a file, :mod:`tests.integration.apps.traced_app`),
and the log lines of a worker carry the operation and the span."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from tests.helpers import (
    kill_group,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    stop_processes,
    toolq_env,
    wait_until,
)
from tests.integration.apps import traced_app
from tests.integration.apps.traced_app import SPANS_ENV, span_json
from tests.otel import in_memory
from toolq import ToolQueue

APP = "tests.integration.apps.traced_app:tq"
STATES = {
    "queued",
    "running",
    "waiting_retry",
    "verifying",
    "awaiting_approval",
    "needs_input",
    "succeeded",
    "failed",
    "escalated",
    "cancelled",
}


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    traced_app.tq.configure(redis_url=module_redis_url)
    yield traced_app.tq
    traced_app.tq.close()


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans") / "spans.jsonl"


@pytest.fixture(scope="module", autouse=True)
def background(tq: ToolQueue, module_redis_url: str, spans_file: Path) -> Iterator[None]:
    """A verify worker and a scheduler, both tracing to the file, for the module."""
    env = {SPANS_ENV: str(spans_file)}
    procs = [
        start_worker(APP, module_redis_url, queues="toolq.verify", concurrency=2, env=env),
        start_scheduler(APP, module_redis_url, env=env),
    ]
    yield
    stop_processes(procs)


@pytest.fixture
def calls_worker(
    tq: ToolQueue, module_redis_url: str, spans_file: Path
) -> Iterator[subprocess.Popen[bytes]]:
    p = start_worker(APP, module_redis_url, queues="toolq.calls", env={SPANS_ENV: str(spans_file)})
    yield p
    stop_process(p)


def _file_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _of(spans: list[dict[str, Any]], ref: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["attributes"].get("toolq.operation_ref") == ref]


def _settled_span(path: Path, ref: str) -> bool:
    return any(
        s["attributes"].get("toolq.state") == "succeeded" for s in _of(_file_spans(path), ref)
    )


def _state_events(spans: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any]]]:
    """Every state event of these spans (name, ns, attributes), in the order the ledger
    took them."""
    events = [(e["name"], e["at"], e["attributes"]) for s in spans for e in s["events"]]
    return sorted((e for e in events if e[0] in STATES), key=lambda e: e[1])


def _traced_call(
    tq: ToolQueue, args: dict[str, Any], ref: str
) -> tuple[str, str, list[dict[str, Any]]]:
    """Submit under an agent's span; (its trace id, its span id, the spans of this process)."""
    with in_memory() as memory:
        with trace.get_tracer("agent").start_as_current_span("agent tool call") as caller:
            tq.submit("pay", args, operation_ref=ref, call_id="call_7")
        ctx = caller.get_span_context()
        local = [span_json(s) for s in memory.get_finished_spans()]
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", local


def _attempts(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    runs = [
        s for s in spans if s["name"] == "execute_tool pay" and "toolq.check" not in s["attributes"]
    ]
    return sorted(runs, key=lambda s: s["start"])


def _checks(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = [s for s in spans if "toolq.check" in s["attributes"]]
    return sorted(checks, key=lambda s: s["start"])


def test_a_call_rate_limited_then_verified_is_one_trace_under_the_callers_span(
    tq: ToolQueue, spans_file: Path, calls_worker: subprocess.Popen[bytes]
) -> None:
    # Given an agent's tool span, when it submits a call that is rate-limited once,
    # then loses its reply after the provider committed
    trace_id, caller_id, local = _traced_call(tq, {"mode": "lost_reply"}, "tr/lost")
    env = tq.wait("tr/lost", timeout=30)
    assert env.ok and env.verification.evidence_ref == "verification:find_payment"
    assert wait_until(lambda: _settled_span(spans_file, "tr/lost"), 10)  # written after the record

    # Then every span about the operation is in the caller's trace
    spans = _of(local + _file_spans(spans_file), "tr/lost")
    assert {s["trace_id"] for s in spans} == {trace_id}
    (submit,) = [s for s in spans if s["name"] == "submit pay"]
    assert (submit["kind"], submit["parent_id"]) == ("PRODUCER", caller_id)
    below = [s for s in spans if s is not submit]
    assert below and {s["parent_id"] for s in below} == {submit["span_id"]}

    # one span per attempt, GenAI's execute_tool with toolq's attributes
    a1, a2 = _attempts(spans)
    for n, a in ((1, a1), (2, a2)):
        assert a["attributes"]["gen_ai.operation.name"] == "execute_tool"
        assert a["attributes"]["gen_ai.tool.name"] == "pay"
        assert a["attributes"]["gen_ai.tool.call.id"] == "call_7"
        assert a["attributes"]["toolq.attempt"] == n
        assert a["status"] == "UNSET"  # a retry and an unknown outcome are no failures
    assert {k: a1["attributes"][k] for k in ("toolq.state", "toolq.code", "toolq.next_action")} == {
        "toolq.state": "waiting_retry",
        "toolq.code": "RATE_LIMITED",
        "toolq.next_action": "wait_and_retry",
    }
    assert {
        k: a2["attributes"][k] for k in ("toolq.state", "toolq.code", "toolq.commit_state")
    } == {
        "toolq.state": "verifying",
        "toolq.code": "OUTCOME_UNKNOWN",
        "toolq.commit_state": "unknown",
    }
    check = _checks(spans)[-1]
    assert check["name"] == "execute_tool pay" and check["attributes"]["toolq.attempt"] == 2
    assert check["attributes"]["toolq.state"] == "succeeded"
    assert check["attributes"]["toolq.code"] == "VERIFIED_COMMITTED"
    assert check["attributes"]["toolq.commit_state"] == "committed"
    # the delayed retry was made due by the scheduler, in the same trace
    assert any(s["name"] == "dispatch pay" and s["pid"] != a1["pid"] for s in spans)

    # and the state events tell the story in order, each on the span that caused it
    events = _state_events(spans)
    assert [name for name, _, _ in events] == [
        "queued",
        "running",
        "waiting_retry",
        "queued",
        "running",
        "verifying",
        "succeeded",
    ]
    # the retry was not made due early, compared exactly: as a float, timestamp() * 1e9
    # lands above the whole millisecond in 37 % of cases, so a dispatch in not_before's
    # own millisecond (no jitter drawn: 1 in 31 here) failed
    not_before = datetime.fromisoformat(events[2][2]["toolq.not_before"])
    not_before_us = (not_before - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert events[3][1] >= not_before_us * 1000
    assert events[-1][2]["toolq.settled"] is True
    # never the arguments or the result
    assert not any("mode" in json.dumps(s["attributes"]) for s in spans)


def test_a_worker_killed_mid_call_leaves_the_recovery_in_the_same_trace(
    tq: ToolQueue, spans_file: Path, calls_worker: subprocess.Popen[bytes]
) -> None:
    # Given a call whose second attempt committed and is still inside the tool
    trace_id, _, local = _traced_call(tq, {"mode": "ok", "sleep": 60}, "tr/killed")
    assert wait_until(lambda: b"tr/killed" in tq.redis.lrange("traced:in_write", 0, -1), 20)

    # When its worker is killed (SIGKILL, the whole process group)
    kill_group(calls_worker)

    # Then the lease sweep and the check settle it, and every span is in the caller's trace
    env = tq.wait("tr/killed", timeout=30)
    assert env.ok and env.verification.evidence_ref == "verification:find_payment"
    assert wait_until(lambda: _settled_span(spans_file, "tr/killed"), 10)
    spans = _of(local + _file_spans(spans_file), "tr/killed")
    assert {s["trace_id"] for s in spans} == {trace_id}
    # the killed attempt's span never ended; the first attempt's did
    assert [a["attributes"]["toolq.attempt"] for a in _attempts(spans)] == [1]
    names = [name for name, _, _ in _state_events(spans)]
    assert names[:3] == ["queued", "running", "waiting_retry"]
    assert names[-2:] == ["verifying", "succeeded"]
    recovered = next(s for s in spans if any(e["name"] == "verifying" for e in s["events"]))
    assert recovered["attributes"]["toolq.code"] == "LEASE_EXPIRED"
    assert _checks(spans)[-1]["attributes"]["toolq.state"] == "succeeded"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_workers_log_lines_carry_the_operation_and_its_span(
    tq: ToolQueue, module_redis_url: str, spans_file: Path, tmp_path: Path, fmt: str
) -> None:
    # Given a worker logging at INFO in the format asked for
    log_path = tmp_path / "worker.log"
    env = {SPANS_ENV: str(spans_file), "TOOLQ_LOG_FORMAT": fmt}
    args = ["worker", "--app", APP, "--redis-url", module_redis_url, "--queues", "toolq.calls"]
    args += ["--pool", "threads", "--concurrency", "1", "--loglevel", "INFO"]
    with log_path.open("wb") as out:
        worker = start_toolq(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            # When a traced call is rate-limited (one INFO line about it)
            ref = f"tr/log-{fmt}"
            line_about = f"tool pay: {ref} attempt 1: RATE_LIMITED"
            trace_id, _, _ = _traced_call(tq, {"mode": "ok"}, ref)
            assert tq.wait(ref, timeout=30).ok
            assert wait_until(lambda: line_about in log_path.read_text(), 10)
        finally:
            stop_process(worker)
    attempt1 = next(a for a in _attempts(_of(_file_spans(spans_file), ref)))

    # Then that line names the operation, the trace and the attempt's span
    line = next(x for x in log_path.read_text().splitlines() if line_about in x)
    if fmt == "json":
        record = json.loads(line)
        assert set(record) >= {"ts", "level", "logger", "msg"}
        assert (record["level"], record["logger"]) == ("INFO", "toolq.worker")
        assert (record["operation_ref"], record["trace_id"], record["span_id"]) == (
            ref,
            trace_id,
            attempt1["span_id"],
        )
        # every log line is one JSON object (Celery's banner and Python's warnings are
        # not log records); none is left in Celery's text format
        lines = log_path.read_text().splitlines()
        assert sum(1 for x in lines if x.startswith("{") and json.loads(x)) > 1
        assert not [x for x in lines if x.startswith("[20")]
    else:
        assert line.endswith(
            f"[operation_ref={ref} trace_id={trace_id} span_id={attempt1['span_id']}]"
        )


def test_toolq_submits_and_runs_without_opentelemetry(
    tq: ToolQueue, module_redis_url: str, calls_worker: subprocess.Popen[bytes]
) -> None:
    # Given a process where opentelemetry cannot be imported
    script = f"""
import sys
sys.modules["opentelemetry"] = None  # any import of it fails
from tests.integration.apps.traced_app import tq
from toolq.process import tracing
tq.configure(redis_url={module_redis_url!r})
assert tracing.otel is None and not tracing.enabled()
env = tq.call("pay", {{"mode": "ok"}}, operation_ref="tr/no-otel", timeout=30)
assert env.ok, env
assert not [m for m in sys.modules if m.startswith("opentelemetry.")]
print("ran")
"""
    # When it submits and waits for a call, Then it runs as ever and stores no context
    out = subprocess.run(
        [sys.executable, "-c", script], env=toolq_env(), capture_output=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == b"ran", out.stderr.decode()[-2000:]
    assert "trace" not in tq.ledger.fields("tr/no-otel", "trace", "state")
