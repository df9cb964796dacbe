"""``tracing.caller``: what a framework adapter adds to toolq's submit span (issue 30):
the framework's ids as attributes, and its own span's ids as the parent only when no
OpenTelemetry span is current."""

from __future__ import annotations

from opentelemetry import trace

from tests.otel import in_memory
from toolq.process import tracing

TRACE, SPAN = 0x0123456789ABCDEF0123456789ABCDEF, 0xFEDCBA9876543210


def test_with_no_span_current_the_framework_ids_are_the_parent() -> None:
    with in_memory() as spans:
        with tracing.caller({"fw.run_id": "r1"}, parent=(TRACE, SPAN)), tracing.submitting("book"):
            pass
        with tracing.submitting("book"):  # after it: nothing of the caller is left
            pass
    first, second = spans.get_finished_spans()
    assert first.context is not None and first.context.trace_id == TRACE
    assert first.parent is not None and first.parent.span_id == SPAN
    assert first.attributes is not None and first.attributes["fw.run_id"] == "r1"
    assert second.parent is None and second.attributes is not None
    assert "fw.run_id" not in second.attributes


def test_a_current_span_stays_the_parent() -> None:
    tracer_span = trace.get_tracer("test").start_as_current_span
    with (
        in_memory() as spans,
        tracer_span("framework tool") as tool,
        tracing.caller({"fw.run_id": "r2"}, parent=(TRACE, SPAN)),
        tracing.submitting("book"),
    ):
        pass
    submit = next(s for s in spans.get_finished_spans() if s.name == "submit book")
    assert submit.parent is not None
    assert submit.parent.span_id == tool.get_span_context().span_id
    assert submit.attributes is not None and submit.attributes["fw.run_id"] == "r2"


def test_with_tracing_off_nothing_is_attached() -> None:
    with tracing.caller({"fw.run_id": "r3"}, parent=(TRACE, SPAN)):
        assert not trace.get_current_span().get_span_context().is_valid
        assert tracing.carrier() == ""
