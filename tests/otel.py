"""OpenTelemetry in the test process: an SDK provider with an in-memory exporter, set
as the global one for one test and taken away after (the API allows one per process;
its own test utilities reset these globals the same way)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _reset() -> None:
    """No tracer provider, as in a process that never set one."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def in_memory() -> Iterator[InMemorySpanExporter]:
    """Spans this process ends, while inside."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _reset()
        provider.shutdown()
