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

A record without a secret is otherwise left exactly as it was made. One with a secret
has its message formatted and redacted (its ``args`` redacted in place when
that suffices, as uvicorn's access formatter reads them) and its traceback
replaced by the redacted text (``exc_text``; ``exc_info`` is dropped so no
formatter renders the original again).
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from toolq.core.redact import LOG_ARG_MAX, bound_text, cut, redact_text

__all__ = ["RedactingFilter", "install_redaction", "redact_record"]

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


class RedactingFilter(logging.Filter):
    """A handler (or logger) filter that redacts each record; it never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


_FILTER = RedactingFilter()


def _filter_handlers(logger: logging.Logger) -> None:
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(_FILTER)


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
    scheduler``, ``toolq api`` and ``toolq mcp`` do); forked children inherit it.
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
