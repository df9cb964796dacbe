"""toolq's spans and log context on fakeredis, with the SDK's in-memory exporter: the
stored context, the parent-or-link rule, what an attempt and an operator's action
record, and what a log line carries (the processes' story is tests/integration/test_tracing.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from tests.otel import in_memory
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.process import logs, tracing

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STORED_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
STORED_SPAN = 0xB7AD6B7169203331


class Args(BaseModel):
    to: str


@pytest.fixture
def tq(fake_redis: fakeredis.FakeRedis) -> Iterator[ToolQueue]:
    q = ToolQueue(redis_url="redis://fake:6379/0")
    q.app._redis = fake_redis

    @q.tool(max_attempts=2, requires_approval=False)
    def send(args: Args, ctx: CallContext) -> dict[str, Any]:
        if args.to == "busy@example.org":
            raise errors.RateLimited(retry_after=30)
        if args.to == "gone@example.org":
            raise errors.NotFound()
        return {"sent": args.to}

    @send.verifier
    def find(ctx: CallContext) -> None:
        return None

    @q.tool(requires_approval=True)
    def wire(args: Args, ctx: CallContext) -> str:
        return "wired"

    yield q
    q.close()


def _one(spans: Any, name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


# ------------------------------------------------------------------ the stored context


@pytest.mark.parametrize(
    ("stored", "valid"),
    [
        (PARENT, True),
        (PARENT + "|vendor=a,other=b", True),
        ("", False),
        ("not a traceparent", False),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),  # invalid id
    ],
)
def test_a_stored_context_reads_back_as_the_span_context_it_was(stored: str, valid: bool) -> None:
    ctx = tracing.stored_context(stored)
    assert (ctx is not None) is valid
    if ctx is not None:
        assert (ctx.trace_id, ctx.span_id) == (STORED_TRACE, STORED_SPAN)
        assert tracing.carrier(trace.NonRecordingSpan(ctx)) == stored


def test_with_no_tracer_provider_nothing_is_traced_and_nothing_stored(tq: ToolQueue) -> None:
    assert not tracing.enabled()
    assert tracing.submitting("send") is tracing.attempt("send", "r", 1, PARENT, "") is not None
    with tracing.submitting("send") as step:
        assert step is tracing.OFF and step.carrier() == ""
    tq.submit("send", {"to": "a"}, operation_ref="off/1")
    assert tq.ledger.fields("off/1", "trace", "state") == {"state": "queued"}


# ------------------------------------------------------------------ the spans


def test_submit_stores_its_own_context_under_the_callers_span(tq: ToolQueue) -> None:
    with in_memory() as memory:
        with trace.get_tracer("agent").start_as_current_span("agent") as caller:
            tq.submit("send", {"to": "a"}, operation_ref="t/1", call_id="c1")
        submit = _one(memory.get_finished_spans(), "submit send")
    assert submit.kind is SpanKind.PRODUCER
    assert submit.parent is not None
    assert submit.parent.span_id == caller.get_span_context().span_id
    stored = tq.ledger.fields("t/1", "trace")["trace"]
    assert tracing.stored_context(stored).span_id == submit.context.span_id  # type: ignore[union-attr]
    assert [e.name for e in submit.events] == ["queued"]
    # a repeat submit of the same ref enters nothing, and says so
    with in_memory() as memory:
        tq.submit("send", {"to": "a"}, operation_ref="t/1")
        again = _one(memory.get_finished_spans(), "submit send")
    assert again.events == () and again.attributes["toolq.existing"] is True  # type: ignore[index]


@pytest.mark.parametrize(
    ("to", "state", "code", "status"),
    [
        ("a", "succeeded", None, StatusCode.UNSET),
        ("busy", "waiting_retry", "RATE_LIMITED", StatusCode.UNSET),
        ("gone", "failed", "NOT_FOUND", StatusCode.ERROR),
    ],
)
def test_an_attempt_records_what_it_did_and_fails_only_when_the_operation_does(
    tq: ToolQueue, to: str, state: str, code: str | None, status: StatusCode
) -> None:
    with in_memory() as memory:
        tq.submit("send", {"to": f"{to}@example.org"}, operation_ref=f"a/{to}", call_id="call_1")
        tq.runtime.run_attempt(f"a/{to}", 1)
        spans = memory.get_finished_spans()
    submit, attempt = _one(spans, "submit send"), _one(spans, "execute_tool send")
    assert attempt.parent is not None and attempt.parent.span_id == submit.context.span_id
    a = dict(attempt.attributes or {})
    assert a["gen_ai.operation.name"] == "execute_tool"
    assert (a["gen_ai.tool.name"], a["gen_ai.tool.call.id"]) == ("send", "call_1")
    assert (a["toolq.operation_ref"], a["toolq.attempt"], a["toolq.state"]) == (f"a/{to}", 1, state)
    assert a.get("toolq.code") == code
    assert attempt.status.status_code is status
    assert [e.name for e in attempt.events] == ["running", state]
    assert "example.org" not in json.dumps(a)  # never the arguments or the result


def test_a_state_recorded_in_the_millisecond_the_attempt_started_sorts_after_running() -> None:
    # The ledger stamps whole milliseconds; the attempt's running is stamped in nanoseconds.
    # A rate limit answered in the same millisecond used to sort before running.
    with in_memory() as memory:
        with tracing.attempt("send", "ms/1", 1, "", "call_1") as step:
            now_ms = time.time_ns() // 1_000_000  # truncated: earlier than running's stamp
            step.entered("waiting_retry", at_ms=now_ms - 1)
        (span,) = memory.get_finished_spans()
    stamps = [(e.name, e.timestamp) for e in span.events]
    assert [name for name, _ in stamps] == ["running", "waiting_retry"]
    assert stamps[0][1] <= stamps[1][1]
    assert sorted(stamps, key=lambda e: e[1]) == stamps


def test_an_operators_approval_is_a_span_in_the_operations_trace_with_who(tq: ToolQueue) -> None:
    with in_memory() as memory:
        tq.submit("wire", {"to": "x"}, operation_ref="op/1")
        tq.approve("op/1", by="console:alice")
        spans = memory.get_finished_spans()
    submit, action = _one(spans, "submit wire"), _one(spans, "operator queued")
    assert action.context.trace_id == submit.context.trace_id
    assert action.attributes["toolq.by"] == "console:alice"  # type: ignore[index]
    assert [e.name for e in submit.events] == ["awaiting_approval"]
    assert [e.name for e in action.events] == ["queued"]


def test_a_copy_of_an_attempt_whose_worker_died_recovers_in_the_operations_trace(
    tq: ToolQueue,
) -> None:
    with in_memory() as memory:
        tq.submit("send", {"to": "a@example.org"}, operation_ref="k/1")
        # a worker elsewhere claimed attempt 1 and its lease ran out (it died)
        assert tq.ledger.claim("k/1", 1, "elsewhere:1:1", 1_000, 1).outcome == "claimed"
        tq.runtime.run_attempt("k/1", 1)  # the message delivered again
        spans = memory.get_finished_spans()
    submit, recover = _one(spans, "submit send"), _one(spans, "recover send")
    assert recover.parent is not None and recover.parent.span_id == submit.context.span_id
    assert recover.attributes["toolq.code"] == "LEASE_EXPIRED"  # type: ignore[index]
    assert [e.name for e in recover.events] == ["verifying"]
    assert not [s for s in spans if s.name == "execute_tool send"]  # the tool was not called


@pytest.mark.parametrize(
    ("age_ms", "child"),
    [(0, True), (tracing.LINK_AFTER_MS, True), (tracing.LINK_AFTER_MS + 1, False)],
)
def test_the_scheduler_is_a_child_of_a_young_operation_and_links_to_an_old_one(
    age_ms: int, child: bool
) -> None:
    with in_memory() as memory:
        with tracing.dispatched("send", "r/1", PARENT, age_ms, "scheduler"):
            pass
        span = _one(memory.get_finished_spans(), "dispatch send")
    links = [(link.context.trace_id, link.context.span_id) for link in span.links]
    if child:
        assert span.parent is not None and span.parent.span_id == STORED_SPAN
        assert span.context.trace_id == STORED_TRACE and links == []
    else:
        assert span.parent is None and span.context.trace_id != STORED_TRACE
        assert links == [(STORED_TRACE, STORED_SPAN)]


# ------------------------------------------------------------------ log lines


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("toolq.worker", logging.INFO, __file__, 1, msg, None, None)


def test_a_log_line_carries_the_operation_and_the_span_in_either_format() -> None:
    text = logs._WithContext(logging.Formatter("%(levelname)s %(message)s"))
    assert text.format(_record("idle")) == "INFO idle"  # about nothing: as it was
    with in_memory(), trace.get_tracer("t").start_as_current_span("s") as span, logs.about("r/1"):
        ctx = span.get_span_context()
        ids = f"trace_id={ctx.trace_id:032x} span_id={ctx.span_id:016x}"
        assert text.format(_record("tool ran")) == f"INFO tool ran [operation_ref=r/1 {ids}]"
        line = json.loads(logs.JsonFormatter().format(_record("tool ran")))
    assert set(line) == {"ts", "level", "logger", "msg", *logs.CONTEXT_FIELDS}
    assert (line["level"], line["logger"], line["msg"], line["operation_ref"]) == (
        "INFO",
        "toolq.worker",
        "tool ran",
        "r/1",
    )
    assert (line["trace_id"], line["span_id"]) == (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")


@pytest.mark.parametrize(
    ("value", "fmt"), [("json", "json"), (" JSON ", "json"), ("", "text"), ("xml", "text")]
)
def test_the_log_format_is_json_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, value: str, fmt: str
) -> None:
    monkeypatch.setenv("TOOLQ_LOG_FORMAT", value)
    assert logs.log_format() == fmt
