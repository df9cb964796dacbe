"""OpenTelemetry spans for an operation, when the application traces (``toolq[otel]``).

The only module that imports ``opentelemetry`` (the API, never the SDK). Without the
package, or without a tracer provider set, every entry point here hands back one
shared do-nothing :data:`OFF` step, after one check: no span, no context, no field.

The story of an operation is one trace under the caller's span:

- ``submit`` (kind PRODUCER), in the client: its context, W3C ``traceparent`` and
  ``tracestate`` (:func:`carrier`), is stored on the record (field :data:`FIELD`)
  by SUBMIT, so every later step reads it back from the ledger, in any process,
  hours later, after a worker was killed or a message republished;
- ``execute_tool {tool}`` (GenAI semantic conventions), one per attempt in the
  worker, and one per verification check (``toolq.check`` set), children of the
  stored context;
- ``dispatch {tool}`` in the scheduler when it moves an operation (a delayed retry
  made due, a check published, a lost lease settled): a child of the stored
  context while the operation is younger than :data:`LINK_AFTER_MS`; past it the
  caller's trace has long ended, and the span starts a trace of its own with a
  *link* to the stored context (the attempt it causes is still a child of it);
- ``operator {action}``, an operator's action, with who (``toolq.by``).

Every state an operation enters is an event named after the state, on the span of
the step that moved it (``waiting_retry`` with ``toolq.not_before``). Attributes are
ids, codes and states only, never arguments or results.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from toolq.core.states import SETTLED, State

if TYPE_CHECKING:
    from toolq.decisions.recovery.transition import Transition

otel: Any  # opentelemetry.trace, or None
try:
    from opentelemetry import trace as otel
    from opentelemetry.context import Context as _Root
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: tracing stays off
    otel = None

#: The record field that holds the submitter's trace context: ``traceparent`` and,
#: when there is one, ``|tracestate``.
FIELD = "trace"
#: Past this age an operation's scheduler span links to the stored context instead
#: of being its child: the caller's span ended long ago (a retry an hour later).
LINK_AFTER_MS = 5 * 60_000

__all__ = [
    "FIELD",
    "LINK_AFTER_MS",
    "OFF",
    "Step",
    "attempt",
    "carrier",
    "check",
    "current",
    "dispatched",
    "enabled",
    "ids",
    "operator",
    "recovered",
    "stored_context",
    "submitting",
]

_VERSION = "00"


class Step:
    """One span of toolq's, or none (:data:`OFF`, whose methods do nothing)."""

    __slots__ = ("last_ns", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.last_ns = 0  # the newest event's stamp: a span's events never go back in time

    def set(self, **attrs: str | int | bool | None) -> None:
        if self.span is not None:
            for name, value in attrs.items():
                if value is not None and value != "":
                    self.span.set_attribute("toolq." + name, value)

    def carrier(self) -> str:
        """The context a submit stores: this span's, or (tracing off) the caller's if any."""
        return carrier(self.span)

    def submitted(self, ref: str, state: State, created: bool, at_ms: int) -> None:
        """The submit's answer; ``at_ms``: when the record says it was created."""
        if self.span is not None:
            self.span.set_attribute("toolq.operation_ref", ref)
            if created:
                self.entered(state, at_ms=at_ms)
            else:
                self.set(existing=True)

    def entered(self, state: State | str, at_ms: int | None = None, **attrs: str | int) -> None:
        """An event for a state entered, named after it; ``at_ms``: when the ledger moved
        it (events of several processes then sort in the order the ledger took them)."""
        if self.span is not None:
            a: dict[str, Any] = {"toolq." + k: v for k, v in attrs.items()}
            a["toolq.state"] = str(state)
            if state in SETTLED:
                a["toolq.settled"] = True
            # The ledger's stamps are whole milliseconds; an event stamped now (the
            # attempt's running) has nanoseconds. A state the same attempt enters in the
            # same millisecond must still sort after it.
            at = time.time_ns() if at_ms is None else at_ms * 1_000_000
            at = self.last_ns = max(at, self.last_ns)
            self.span.add_event(str(state), a, at)

    def recorded(self, t: Transition, answer: str, at_ms: int | None = None) -> None:
        """What an applied transition says: its state and envelope's words, an event, and
        ERROR status for a failure (never for a retry or a check still to come)."""
        if self.span is None:
            return
        if answer != "ok":
            self.set(refused=answer)
            return
        env = t.envelope
        self.set(
            state=str(t.to), code=t.code or (None if env is None else getattr(env, "code", None))
        )
        attrs: dict[str, str | int] = {}
        if env is not None:
            self.set(commit_state=str(env.commit_state))
            if not env.ok:
                self.set(next_action=str(env.next_action))
                if env.retry.not_before is not None:
                    attrs["not_before"] = env.retry.not_before.isoformat()
        if t.note:
            attrs.update({"note." + k: v for k, v in t.note.items()})
        if not t.quiet or t.note:  # a quiet update enters no state; a noted one says why
            self.entered(t.to, at_ms, **attrs)
        if t.to in (State.FAILED, State.ESCALATED):
            self.span.set_status(otel.StatusCode.ERROR, t.code or str(t.to))

    def failed(self, exc: BaseException) -> None:
        """The step itself broke (not the tool: the tool's failures are recorded)."""
        if self.span is not None:
            self.span.set_status(otel.StatusCode.ERROR, type(exc).__name__)


#: The step of every call while tracing is off.
OFF = Step(None)


class _Off:
    """The context manager handed out while tracing is off: one shared object."""

    __slots__ = ()

    def __enter__(self) -> Step:
        return OFF

    def __exit__(self, *exc: object) -> None:
        return None


_OFF_CM = _Off()


def enabled() -> bool:
    """A tracer provider is set (with the API installed): spans will be recorded."""
    if otel is None:
        return False
    provider = otel.get_tracer_provider()
    return not isinstance(provider, otel.ProxyTracerProvider | otel.NoOpTracerProvider)


_tracers: list[Any] = [None, None]  # (provider, its tracer): get_tracer costs a span's worth


def _tracer() -> Any:
    provider = otel.get_tracer_provider()
    if _tracers[0] is not provider:
        _tracers[:] = [provider, provider.get_tracer("toolq")]
    return _tracers[1]


# --------------------------------------------------------------------------- the stored context


def ids() -> tuple[str, str]:
    """The current span's trace and span ids (hex) for a log line; ("", "") for none."""
    if otel is None:
        return "", ""
    ctx = otel.get_current_span().get_span_context()
    if not ctx.is_valid:
        return "", ""
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def carrier(span: Any = None) -> str:
    """The W3C context of ``span`` (or of the current span) as the record stores it; ""
    when there is none."""
    if otel is None:
        return ""
    ctx = (span or otel.get_current_span()).get_span_context()
    if not ctx.is_valid:
        return ""
    parent = f"{_VERSION}-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return f"{parent}|{state}" if state else parent


def stored_context(stored: str) -> Any:
    """The span context a record's field holds, or None (none, or not one we can read)."""
    if otel is None or not stored:
        return None
    parent, _, state = stored.partition("|")
    headers = {"traceparent": parent}
    if state:
        headers["tracestate"] = state
    ctx = TraceContextTextMapPropagator().extract(headers)
    span_ctx = otel.get_current_span(ctx).get_span_context()
    return span_ctx if span_ctx.is_valid else None


def _parent(stored: str) -> Any:
    span_ctx = stored_context(stored)
    return None if span_ctx is None else otel.set_span_in_context(otel.NonRecordingSpan(span_ctx))


# --------------------------------------------------------------------------- the spans


def _tool_attrs(tool: str, ref: str, call_id: str | None) -> dict[str, Any]:
    a: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "toolq.operation_ref": ref,
    }
    if call_id:
        a["gen_ai.tool.call.id"] = call_id
    return a


def submitting(tool: str) -> AbstractContextManager[Step]:
    """The client's ``submit`` span (PRODUCER), current while the submit runs: its
    :func:`carrier` is what the record stores."""
    if not enabled():
        return _OFF_CM
    attrs = {**(_CALLER.get() or {}), "gen_ai.tool.name": tool}
    return _span(f"submit {tool}", otel.SpanKind.PRODUCER, None, attrs)


def attempt(
    tool: str, ref: str, number: int, stored: str, call_id: str
) -> AbstractContextManager[Step]:
    """One attempt of the tool in the worker: ``execute_tool {tool}``."""
    if not enabled():
        return _OFF_CM
    a = _tool_attrs(tool, ref, call_id)
    a["toolq.attempt"] = number
    return _span(f"execute_tool {tool}", otel.SpanKind.INTERNAL, _parent(stored), a, State.RUNNING)


def check(
    tool: str, ref: str, number: int, vcheck: int, stored: str, call_id: str
) -> AbstractContextManager[Step]:
    """One verification check: ``execute_tool {tool}`` with ``toolq.check``."""
    if not enabled():
        return _OFF_CM
    a = _tool_attrs(tool, ref, call_id)
    a.update({"toolq.attempt": number, "toolq.check": vcheck})
    return _span(f"execute_tool {tool}", otel.SpanKind.INTERNAL, _parent(stored), a)


def dispatched(
    tool: str, ref: str, stored: str, age_ms: int, by: str
) -> AbstractContextManager[Step]:
    """The scheduler's move of a due operation: a child of the stored context, or, past
    :data:`LINK_AFTER_MS`, a new trace linked to it."""
    if not enabled():
        return _OFF_CM
    a = {"toolq.operation_ref": ref, "gen_ai.tool.name": tool, "toolq.by": by}
    if age_ms <= LINK_AFTER_MS:
        return _span(f"dispatch {tool}", otel.SpanKind.PRODUCER, _parent(stored), a)
    span_ctx = stored_context(stored)
    links = [otel.Link(span_ctx)] if span_ctx is not None else []
    return _span(f"dispatch {tool}", otel.SpanKind.PRODUCER, _Root(), a, None, links)


def recovered(
    tool: str, ref: str, number: int, stored: str, by: str
) -> AbstractContextManager[Step]:
    """A worker given a copy of an attempt whose holder died: ``recover {tool}``."""
    if not enabled():
        return _OFF_CM
    a = {
        "toolq.operation_ref": ref,
        "gen_ai.tool.name": tool,
        "toolq.attempt": number,
        "toolq.by": by,
    }
    return _span(f"recover {tool}", otel.SpanKind.INTERNAL, _parent(stored), a)


def operator(t: Transition, stored: str) -> AbstractContextManager[Step]:
    """An operator's action (``operator {state it moves to}``), with who (``toolq.by``)."""
    if not enabled():
        return _OFF_CM
    a = {"toolq.operation_ref": t.ref, "toolq.by": t.by}
    return _span(f"operator {t.to}", otel.SpanKind.INTERNAL, _parent(stored), a)


def current() -> Step:
    """The toolq span this code runs in (an attempt's, a check's), or :data:`OFF`."""
    return _STEP.get()


_STEP: ContextVar[Step] = ContextVar("toolq_step", default=OFF)


@contextmanager
def _span(
    name: str,
    kind: Any,
    parent: Any,
    attrs: dict[str, Any],
    first: State | None = None,
    links: list[Any] | None = None,
) -> Iterator[Step]:
    with _tracer().start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attrs,
        links=links,
        record_exception=False,  # an exception's text may carry upstream secrets
        set_status_on_exception=False,
    ) as span:
        step = Step(span)
        if first is not None:
            step.entered(first)
        token = _STEP.set(step)
        try:
            yield step
        except BaseException as exc:
            step.failed(exc)
            raise
        finally:
            _STEP.reset(token)


# --------------------------------------------------------------------------- the framework's call

#: What the framework adapters know of the call being submitted (its ids in the
#: framework's own tracing), for the submit span: :func:`caller`.
_CALLER: ContextVar[dict[str, str] | None] = ContextVar("toolq_caller", default=None)


@contextmanager
def caller(attrs: dict[str, str], parent: tuple[int, int] | None = None) -> Iterator[None]:
    """While a framework adapter submits: ``attrs`` on the submit span (the framework's
    ids for its tool call, e.g. ``langchain.run_id``) and, when no span is current,
    ``parent`` (a trace id and span id from the framework's own tracing) as its parent,
    so the calls of one agent run are one trace. Nothing while tracing is off."""
    if not enabled():
        yield
        return
    token = _CALLER.set(attrs)
    try:
        if parent is None or otel.get_current_span().get_span_context().is_valid:
            yield
            return
        remote = otel.SpanContext(
            trace_id=parent[0],
            span_id=parent[1],
            is_remote=True,
            trace_flags=otel.TraceFlags(otel.TraceFlags.SAMPLED),
        )
        with otel.use_span(otel.NonRecordingSpan(remote), end_on_exit=False):
            yield
    finally:
        _CALLER.reset(token)
