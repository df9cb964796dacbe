"""Secrets out of log records: every record a toolq process logs passes the redactor.

An envelope never carries upstream text, but a log line does: a tool that
raises ``RuntimeError("upstream said: token sk-live-…")`` is logged with its
traceback, and the exception's message is in it. :func:`install_redaction`
makes every record pass :func:`toolq.core.redact.redact_text` (its message with its
arguments, its traceback text, its stack text) before any handler formats it:

- a record factory redacts each record as it is made, whatever logger made it
  and whichever handler (added now or later: Celery replaces the root
  logger's handlers when a worker starts) will write it;
- :class:`RedactingFilter` on the root logger's handlers, and on the handlers
  Celery sets up (``after_setup_logger``, ``after_setup_task_logger``), covers
  records made without the factory (``logging.makeLogRecord``).

Each record is first cut to bounded size (:data:`toolq.core.redact.LOG_ARG_MAX` per
string argument, :data:`~toolq.core.redact.LOG_LINE_MAX` per line,
:data:`~toolq.core.redact.LOG_TEXT_MAX` in all, marked where cut): redaction then
costs at most a few milliseconds, whatever a request or an upstream sent, on the
event loop where uvicorn logs its access lines.

Each record also carries the operation it is about (``operation_ref``: what
:func:`about` set in this thread or task, "" for none) and, while tracing is on, the
current span's ``trace_id`` and ``span_id`` (:mod:`toolq.process.tracing`). Handlers print
them after the message, or, with ``TOOLQ_LOG_FORMAT=json``, as fields of one JSON
object per line (:class:`JsonFormatter`).

A record without a secret is otherwise left exactly as it was made. One with a secret
has its message formatted and redacted (its ``args`` redacted in place when
that suffices, as uvicorn's access formatter reads them) and its traceback
replaced by the redacted text (``exc_text``; ``exc_info`` is dropped so no
formatter renders the original again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import traceback
from collections.abc import Callable
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

from toolq.core.redact import LOG_ARG_MAX, bound_text, cut, redact_text
from toolq.process import tracing

__all__ = ["JsonFormatter", "RedactingFilter", "about", "install_redaction", "redact_record"]

#: What the records of this thread or task are about (:func:`about`).
_REF: ContextVar[str] = ContextVar("toolq_log_ref", default="")
#: The fields a record gets (and a JSON line holds, after ts, level, logger, msg).
CONTEXT_FIELDS = ("operation_ref", "trace_id", "span_id")

_MARK = "_toolq_redacted"
_lock = threading.Lock()
_installed = False


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Redact ``record`` in place (once) and return it."""
    if getattr(record, _MARK, False):
        return record
    try:
        _bound_message(record)
        _redact_message(record)
        _redact_exception(record)
        if record.stack_info:
            record.stack_info = redact_text(bound_text(record.stack_info))
    except Exception:  # never lose the line, never keep what could not be checked
        record.msg, record.args = "[log record withheld: it could not be redacted]", None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
    setattr(record, _MARK, True)
    return record


def _bound_message(record: logging.LogRecord) -> None:
    """Cut the record's arguments, then its message, before anything scans them."""
    _map_text_args(record, lambda text: cut(text, LOG_ARG_MAX))
    try:
        message = record.getMessage()
    except Exception:  # a format/args mismatch: left for logging to report
        return
    bounded = bound_text(message)
    if bounded != message:
        record.msg, record.args = bounded, None


def _map_text_args(record: logging.LogRecord, fn: Callable[[str], str]) -> None:
    """``fn`` applied to each string argument of the record (positional or named)."""
    if isinstance(record.args, tuple):
        record.args = tuple(fn(a) if isinstance(a, str) else a for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: fn(v) if isinstance(v, str) else v for k, v in record.args.items()}


def _redact_message(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a format/args mismatch: logging reports it, with both, at emit
        message = None
    if message is not None:
        clean = redact_text(message)
        if clean == message:
            return
    record.msg = redact_text(str(record.msg))
    _map_text_args(record, redact_text)
    try:
        still = record.getMessage()
    except Exception:
        still = None
    if still is None or redact_text(still) != still:
        # An argument's own str() or repr() carries the secret: keep the redacted text only.
        record.msg = redact_text(message) if message is not None else record.msg
        record.args = None


def _redact_exception(record: logging.LogRecord) -> None:
    text = record.exc_text
    if record.exc_info and isinstance(record.exc_info, tuple) and record.exc_info[0] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    if not text:
        return
    clean = redact_text(bound_text(text))
    if clean != text:
        record.exc_text, record.exc_info = clean, None


class about:
    """The log records made inside carry ``operation_ref`` (a thread's or a task's own)."""

    __slots__ = ("ref", "token")

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.token: Token[str] | None = None

    def __enter__(self) -> None:
        self.token = _REF.set(self.ref)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _REF.reset(self.token)


def add_context(record: logging.LogRecord) -> logging.LogRecord:
    """Set the record's ``operation_ref``, ``trace_id`` and ``span_id`` ("" for none)
    unless it has them (from ``extra=``)."""
    if "operation_ref" not in record.__dict__:
        record.operation_ref = _REF.get()
    if "trace_id" not in record.__dict__:
        record.trace_id, record.span_id = tracing.ids()
    return record


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, operation_ref, trace_id,
    span_id (and ``exc``, the redacted traceback, when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        add_context(record)
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            out[name] = getattr(record, name, "") or None
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


class _WithContext(logging.Formatter):
    """A handler's own format, followed by the record's operation and span ids."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        add_context(record)
        line = self.inner.format(record)
        ref = getattr(record, "operation_ref", "")
        if not ref and not getattr(record, "trace_id", ""):
            return line
        more = [f"{n}={getattr(record, n)}" for n in CONTEXT_FIELDS if getattr(record, n, "")]
        head, nl, tail = line.partition("\n")  # after the message, before a traceback
        return f"{head} [{' '.join(more)}]{nl}{tail}"


def log_format() -> str:
    """``TOOLQ_LOG_FORMAT``: "json", or "text" (the default, and for anything else)."""
    return "json" if os.environ.get("TOOLQ_LOG_FORMAT", "").strip().lower() == "json" else "text"


def _format_handler(handler: logging.Handler) -> None:
    if isinstance(handler.formatter, JsonFormatter | _WithContext):
        return
    if log_format() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_WithContext(handler.formatter))


class RedactingFilter(logging.Filter):
    """A handler (or logger) filter that redacts each record; it never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        add_context(record)
        return True


_FILTER = RedactingFilter()


def _filter_handlers(logger: logging.Logger) -> None:
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(_FILTER)
        _format_handler(handler)


def _wrap_factory(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return redact_record(make(*args, **kwargs))

    setattr(factory, _MARK, True)
    return factory


def _after_setup_logger(logger: logging.Logger | None = None, **_: Any) -> None:
    if logger is not None:
        _filter_handlers(logger)
    _filter_handlers(logging.getLogger())


def install_redaction() -> None:
    """Redact every log record of this process from now on. Idempotent.

    Call it first thing in a process entry point (``toolq worker``, ``toolq
    scheduler``, ``toolq api`` and ``toolq mcp`` do); forked children inherit it. The
    root logger's handlers, then and after Celery sets up logging, also print each
    record's operation and span ids (:data:`CONTEXT_FIELDS`; ``TOOLQ_LOG_FORMAT=json``).
    """
    global _installed
    with _lock:
        current = logging.getLogRecordFactory()
        if not getattr(current, _MARK, False):
            logging.setLogRecordFactory(_wrap_factory(current))
        _filter_handlers(logging.getLogger())
        if _installed:
            return
        _installed = True
    from celery import signals  # a worker started by `celery -A app worker` sets its own

    signals.after_setup_logger.connect(_after_setup_logger, weak=False)
    signals.after_setup_task_logger.connect(_after_setup_logger, weak=False)


def _install_on_setup(**_: Any) -> None:
    install_redaction()


def redact_worker_logs() -> None:
    """Redact the logs of a Celery worker this process becomes, and nothing else.

    Connected when toolq's Celery app is built (:func:`toolq.adapters.broker.app.make_celery`),
    so a plain ``celery -A module worker`` redacts too, while a process that only
    submits calls keeps its logging as it was. Idempotent (Celery dedupes the receiver).
    """
    from celery import signals

    signals.after_setup_logger.connect(_install_on_setup, weak=False)
