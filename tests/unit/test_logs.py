"""Log records pass the redactor: message, arguments, traceback (toolq.process.logs)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from toolq.process.logs import RedactingFilter, install_redaction, redact_record

TOKEN = "sk-live-abcdef0123456789abcdef"


def _record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("toolq.worker", logging.WARNING, __file__, 1, msg, args, exc_info)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _formatted(record: logging.LogRecord) -> str:
    return logging.Formatter("%(levelname)s %(message)s").format(record)


def test_the_message_its_arguments_and_the_traceback_are_redacted() -> None:
    exc = _raised(RuntimeError(f"upstream said: token {TOKEN}"))
    record = redact_record(
        _record("tool %s failed for %s: %s", "pay", "run_1/step_1", exc, exc=exc)
    )
    text = _formatted(record)
    assert TOKEN not in text
    assert "tool pay failed for run_1/step_1: upstream said: token [redacted]" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: upstream said: token [redacted]" in text
    assert record.exc_info is None  # no formatter can render the original again


def test_a_record_without_a_secret_is_left_as_it_was_made() -> None:
    exc = _raised(ValueError("bad amount"))
    record = _record("tool %s: %s attempt %d", "pay", "run_1/step_1", 2, exc=exc)
    redact_record(record)
    assert record.args == ("pay", "run_1/step_1", 2) and record.exc_info is not None
    assert record.msg == "tool %s: %s attempt %d"


def test_string_arguments_are_redacted_in_place_when_that_suffices() -> None:
    # uvicorn's access formatter unpacks the five arguments itself
    args = ("127.0.0.1:5000", "GET", f"/v1/x?token={TOKEN}", "1.1", 200)
    record = redact_record(_record('%s - "%s %s HTTP/%s" %d', *args))
    assert isinstance(record.args, tuple) and len(record.args) == 5
    assert record.args[2] == "/v1/x?[redacted]" and record.args[4] == 200
    assert TOKEN not in record.getMessage()


def test_lines_and_indentation_are_kept_and_redaction_is_idempotent() -> None:
    record = _record(f"first line\n    url redis://:hunter2@db:6379/0\n  Bearer {TOKEN}")
    once = redact_record(record).getMessage()
    assert once == "first line\n    url redis://[redacted]@db:6379/0\n  [redacted]"
    assert redact_record(record).getMessage() == once


def test_a_format_error_does_not_leak_the_arguments() -> None:
    record = redact_record(_record("%d items for %s", f"token {TOKEN}"))
    assert TOKEN not in str(record.msg) + str(record.args)


@pytest.fixture
def restored_logging() -> Iterator[None]:
    factory = logging.getLogRecordFactory()
    root = logging.getLogger()
    filters = {h: list(h.filters) for h in root.handlers}
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        for handler, kept in filters.items():
            handler.filters[:] = kept


def test_installed_it_covers_handlers_added_later_and_every_logger(restored_logging: None) -> None:
    install_redaction()
    install_redaction()  # idempotent: one wrapper, one filter per handler
    assert sum(
        isinstance(f, RedactingFilter) for h in logging.getLogger().handlers for f in h.filters
    ) == len(logging.getLogger().handlers)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("some.library")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ConnectionError(f"redis://:{TOKEN}@cache:6379 refused")
        except ConnectionError:
            logger.exception("could not connect: %s", sys.exc_info()[1])
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    out = stream.getvalue()
    assert TOKEN not in out and "could not connect: redis://[redacted]@cache:6379" in out
    assert "ConnectionError: redis://[redacted]@cache:6379 refused" in out


@pytest.mark.timeout(60)
def test_an_access_line_with_a_megabyte_path_is_cut_before_it_is_redacted() -> None:
    """uvicorn's access record for a 1 MB URL: its path argument is cut (marked),
    what is left is redacted, and uvicorn's formatter still reads the arguments."""
    from uvicorn.logging import AccessFormatter

    from toolq.core.redact import LOG_ARG_MAX

    path = f"/v1/health?api_key={TOKEN}&q=" + "token" * (1 << 18)
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", 414),
        None,
    )
    text = AccessFormatter("%(message)s", use_colors=False).format(redact_record(record))
    assert TOKEN not in text and "[redacted]" in text
    assert "characters cut]" in text and len(text) < LOG_ARG_MAX + 200
    assert text.endswith('HTTP/1.1" 414')
