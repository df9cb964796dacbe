"""A tool app for the tracing tests: each worker and scheduler that loads it with
``TOOLQ_TEST_SPANS=<path>`` set writes every span it ends to that file, one JSON object
a line (:class:`FileExporter`), for the test to read.

``pay`` is rate-limited on its first attempt; the second commits and then, by mode,
loses its reply (a timeout: ``lost_reply``) or sleeps inside the write until the
test kills its worker (``sleep``). Its verifier finds what was committed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

SPANS_ENV = "TOOLQ_TEST_SPANS"

settings = ToolqSettings(
    lease=LeaseSettings(seconds=1.5),
    recovery=RecoverySettings(unclaimed_after=3.0),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
)
tq = ToolQueue(settings=settings)
provider = ProcessClient(tq)


class Pay(BaseModel):
    mode: str = "lost_reply"
    sleep: float = 0.0


@tq.tool(writes=True, consistency_window=0.2, max_attempts=4, verify_backoff=0.1)
def pay(args: Pay, ctx: CallContext) -> dict[str, Any]:
    p = provider()
    if ctx.attempt == 1:
        raise errors.RateLimited(retry_after=0.3)
    p.set(f"traced:committed:{ctx.operation_ref}", "1")
    p.rpush("traced:in_write", ctx.operation_ref)
    if args.sleep:
        time.sleep(args.sleep)  # inside the write: the test kills the worker here
    if args.mode == "lost_reply":
        raise TimeoutError("read timed out")
    return {"paid": ctx.operation_ref}


@pay.verifier
def find_payment(ctx: CallContext) -> dict[str, Any] | None:
    if provider().get(f"traced:committed:{ctx.operation_ref}"):
        return {"paid": ctx.operation_ref}
    return None


def span_json(span: Any) -> dict[str, Any]:
    """A finished SDK span as the tests read it (ids in hex)."""
    ctx, parent = span.context, span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else "",
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "at": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
        "links": [
            f"{link.context.trace_id:032x}:{link.context.span_id:016x}" for link in span.links
        ],
        "pid": os.getpid(),
    }


def _install_file_exporter(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    lock = threading.Lock()

    class FileExporter(SpanExporter):
        """Each span as it ends, appended whole (a killed process loses only its open spans)."""

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            lines = "".join(json.dumps(span_json(s)) + "\n" for s in spans)
            with lock, open(path, "a", encoding="utf-8") as f:
                f.write(lines)
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(tracer_provider)


if os.environ.get(SPANS_ENV):
    _install_file_exporter(os.environ[SPANS_ENV])

celery_app = tq.celery
