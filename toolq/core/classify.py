"""Turn what HTTP clients report into the ``ToolFailure`` a tool should raise.

Adapters call these at their edge::

    try:
        response = client.post(url, json=body, headers={"Idempotency-Key": ref})
    except Exception as exc:
        raise classify_exception(exc, writes=True) from exc
    if failure := classify_http(response.status_code, response.headers):
        raise failure

The question behind every choice is whether the request can have reached the
provider. Not sent (DNS failure, connection refused, connect timeout): nothing
committed, so waiting and sending again is safe. Maybe sent (read timeout,
connection closed or reset mid-exchange, a 5xx from a gateway): for a write
the outcome is unknown and is verified; a read is safe to repeat, so it waits
and retries. Text from the exception or the response is never copied; only a
short ``reason`` token and ``http_status`` go to ``safe_details``.

HTTP statuses (``classify_http``):

====================  ================  ==========================================
status                failure           why
====================  ================  ==========================================
2xx                   None
400, 422, other 4xx   InvalidInput      field ``request``, rule ``rejected``; an
                                        adapter that knows the field raises its own
413, 414, 415, 431    InvalidInput      rule names what is wrong with the request
401, 403, 407         ForbiddenScope    credentials or scope; retrying cannot help
402, 405, 451, 501    ForbiddenScope    the operation is not available: choose another
404, 410              NotFound
409, 412, 428         Conflict          reread and resend with the current version
                                        (428: the server wants a conditional request);
                                        an ``ETag`` becomes ``current_state_ref``
408, 425              Unavailable       the server did not process the request
429                   RateLimited       ``Retry-After`` (seconds or HTTP date) becomes
                                        an absolute time
503                   Unavailable       ``Retry-After`` honoured
500, 502, 504, 5xx    OutcomeUnknown    on a write: a proxy can fail while the
                      / Unavailable     upstream commits; on a read: wait and retry
1xx, 3xx, other       ToolFailure       ``UNEXPECTED_STATUS``: verified for a write,
                                        escalated for a read (redirects and 304
                                        are for the adapter to handle)
====================  ================  ==========================================

httpx, requests and urllib3 are optional: this module never imports them, it
looks at them in ``sys.modules`` (an exception of theirs cannot exist unless
they were imported).
"""

from __future__ import annotations

import errno
import http.client
import re
import socket
import ssl
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Literal

from toolq.core.envelope import utc
from toolq.core.errors import (
    MAX_RETRY_DELAY,
    UPSTREAM_ERROR,
    Conflict,
    ForbiddenScope,
    InvalidInput,
    Misconfigured,
    NotFound,
    OutcomeUnknown,
    RateLimited,
    ToolFailure,
    Unavailable,
)
from toolq.core.redact import safe_value

Where = Literal["not_sent", "maybe_sent", "misconfigured"]

# --------------------------------------------------------------------------- HTTP statuses

_INPUT_RULES: dict[int, tuple[str, str]] = {
    400: ("INVALID_REQUEST", "rejected"),
    413: ("PAYLOAD_TOO_LARGE", "too_large"),
    414: ("URI_TOO_LONG", "too_long"),
    415: ("UNSUPPORTED_MEDIA_TYPE", "unsupported_media_type"),
    422: ("UNPROCESSABLE_REQUEST", "rejected"),
    431: ("HEADERS_TOO_LARGE", "too_large"),
}
_FORBIDDEN: dict[int, str] = {
    401: "UNAUTHENTICATED",
    402: "PAYMENT_REQUIRED",
    403: "FORBIDDEN_SCOPE",
    405: "METHOD_NOT_ALLOWED",
    407: "PROXY_AUTHENTICATION_REQUIRED",
    451: "UNAVAILABLE_FOR_LEGAL_REASONS",
    501: "NOT_IMPLEMENTED",
}
_NOT_FOUND: dict[int, str] = {404: "NOT_FOUND", 410: "GONE"}
_CONFLICT: dict[int, str] = {
    409: "STATE_CONFLICT",
    412: "VERSION_CONFLICT",
    428: "PRECONDITION_REQUIRED",
}
_NOT_PROCESSED: dict[int, str] = {
    408: "REQUEST_TIMEOUT",
    425: "TOO_EARLY",
    503: "SERVICE_UNAVAILABLE",
}
_SERVER_ERRORS: dict[int, str] = {
    500: "UPSTREAM_SERVER_ERROR",
    502: "BAD_GATEWAY",
    504: "UPSTREAM_TIMEOUT",
}

_DIGITS = re.compile(r"[0-9]{1,12}")


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """A ``Retry-After`` value (delay-seconds or HTTP-date) as an absolute time.

    ``None`` for a missing or malformed value; a date in the past means ``now``;
    no wait is longer than ``MAX_RETRY_DELAY`` (the value is untrusted).
    """
    if value is None:
        return None
    now = utc(now)
    text = value.strip()
    if _DIGITS.fullmatch(text):
        return now + min(timedelta(seconds=int(text)), MAX_RETRY_DELAY)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    # HTTP dates are GMT; "-0000" parses as naive.
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else utc(when)
    return min(max(when, now), now + MAX_RETRY_DELAY)


def _etag(headers: Mapping[str, str] | None) -> str | None:
    raw = _header(headers, "etag")
    if raw is None:
        return None
    return safe_value(raw.strip().removeprefix("W/").strip('"'))


def classify_http(
    status: int,
    headers: Mapping[str, str] | None = None,
    *,
    now: datetime | None = None,
    writes: bool = True,
) -> ToolFailure | None:
    """The failure an HTTP status means, or ``None`` for 2xx (see module table).

    ``writes`` defaults to the safe side: a 5xx is an unknown outcome unless
    the caller says the request was a read.
    """
    if 200 <= status < 300:
        return None
    now = datetime.now(UTC) if now is None else utc(now)
    if status in _INPUT_RULES:
        code, rule = _INPUT_RULES[status]
        return InvalidInput(field="request", rule=rule, code=code, http_status=status)
    if status in _FORBIDDEN:
        return ForbiddenScope(code=_FORBIDDEN[status], http_status=status)
    if status in _NOT_FOUND:
        return NotFound(code=_NOT_FOUND[status], http_status=status)
    if status in _CONFLICT:
        etag = _etag(headers)
        return Conflict(
            code=_CONFLICT[status],
            current_state_ref=etag,
            resource_version=etag,
            http_status=status,
        )
    retry_at = parse_retry_after(_header(headers, "retry-after"), now)
    if status == 429:
        return RateLimited(retry_after=retry_at or now, http_status=status)
    if status in _NOT_PROCESSED:
        return Unavailable(retry_after=retry_at, code=_NOT_PROCESSED[status], http_status=status)
    if 400 <= status < 500:
        return InvalidInput(
            field="request", rule="rejected", code="CLIENT_ERROR", http_status=status
        )
    if 500 <= status < 600:
        if writes:
            return OutcomeUnknown(http_status=status)
        code = _SERVER_ERRORS.get(status, "UPSTREAM_SERVER_ERROR")
        return Unavailable(retry_after=retry_at, code=code, http_status=status)
    return ToolFailure(code="UNEXPECTED_STATUS", http_status=status)


# --------------------------------------------------------------------------- exceptions

# (class name, where, reason) per library, most specific first. Names, not
# classes, so that a class a future version drops is skipped, not a crash.
_Row = tuple[str, Where | None, str]
_HTTPX: tuple[_Row, ...] = (
    ("ConnectTimeout", "not_sent", "connect_timeout"),
    ("PoolTimeout", "not_sent", "pool_timeout"),
    ("ConnectError", "not_sent", "connect_failed"),
    ("ProxyError", "not_sent", "proxy_error"),
    ("UnsupportedProtocol", "misconfigured", "unsupported_protocol"),
    ("InvalidURL", "misconfigured", "invalid_url"),
    ("LocalProtocolError", "misconfigured", "invalid_request"),
    ("ReadTimeout", "maybe_sent", "read_timeout"),
    ("WriteTimeout", "maybe_sent", "write_timeout"),
    ("RemoteProtocolError", "maybe_sent", "connection_closed"),
    ("ReadError", "maybe_sent", "read_error"),
    ("WriteError", "maybe_sent", "write_error"),
    ("TransportError", "maybe_sent", "transport_error"),
    ("DecodingError", "maybe_sent", "decoding_error"),
    ("TooManyRedirects", "maybe_sent", "too_many_redirects"),
)
_REQUESTS: tuple[_Row, ...] = (
    ("ConnectTimeout", "not_sent", "connect_timeout"),
    ("ReadTimeout", "maybe_sent", "read_timeout"),
    ("ProxyError", "not_sent", "proxy_error"),
    # SSLError and ConnectionError: decided by what caused them (below).
    ("SSLError", None, "tls_error"),
    ("ConnectionError", None, "connection_error"),
    ("Timeout", "maybe_sent", "timeout"),
    ("ChunkedEncodingError", "maybe_sent", "connection_closed"),
    ("ContentDecodingError", "maybe_sent", "decoding_error"),
    ("RetryError", "maybe_sent", "retries_exhausted"),
    ("TooManyRedirects", "maybe_sent", "too_many_redirects"),
    # A body that is not JSON arrived after the request was processed.
    ("JSONDecodeError", "maybe_sent", "decoding_error"),
    ("InvalidJSONError", "misconfigured", "invalid_request"),
    ("InvalidURL", "misconfigured", "invalid_url"),
    ("MissingSchema", "misconfigured", "invalid_url"),
    ("InvalidSchema", "misconfigured", "invalid_url"),
    ("URLRequired", "misconfigured", "invalid_url"),
    ("InvalidHeader", "misconfigured", "invalid_request"),
)


def _markers() -> Iterator[tuple[type[BaseException], Where, str]]:
    """Exceptions found below a library's own: stdlib and urllib3, specific first."""
    u3 = sys.modules.get("urllib3.exceptions")
    rows: list[tuple[Any, Where, str]] = [
        (getattr(u3, "ReadTimeoutError", None), "maybe_sent", "read_timeout"),
        (getattr(u3, "ProtocolError", None), "maybe_sent", "protocol_error"),
        (getattr(u3, "NameResolutionError", None), "not_sent", "dns_failure"),
        # NewConnectionError subclasses ConnectTimeoutError in urllib3 2.x.
        (getattr(u3, "NewConnectionError", None), "not_sent", "connect_failed"),
        (getattr(u3, "ConnectTimeoutError", None), "not_sent", "connect_timeout"),
        (http.client.RemoteDisconnected, "maybe_sent", "connection_closed"),
        (http.client.IncompleteRead, "maybe_sent", "connection_closed"),
        (http.client.HTTPException, "maybe_sent", "protocol_error"),
        (socket.gaierror, "not_sent", "dns_failure"),
        (ConnectionRefusedError, "not_sent", "connect_refused"),
        (ssl.SSLCertVerificationError, "not_sent", "tls_verify_failed"),
        (ConnectionResetError, "maybe_sent", "connection_reset"),
        (BrokenPipeError, "maybe_sent", "connection_reset"),
        (ConnectionAbortedError, "maybe_sent", "connection_reset"),
        # A bare socket timeout does not say which phase it hit.
        (TimeoutError, "maybe_sent", "timeout"),
    ]
    for cls, where, reason in rows:
        if isinstance(cls, type) and issubclass(cls, BaseException):
            yield cls, where, reason


_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH}
#: Reasons a deeper cause may sharpen a verdict to, without changing the side.
_SHARPER = frozenset(
    {
        "dns_failure",
        "connect_refused",
        "network_unreachable",
        "tls_verify_failed",
        "connection_closed",
        "connection_reset",
    }
)


def _chain(exc: BaseException, limit: int = 16) -> list[BaseException]:
    """``exc`` and what caused it, nearest first: ``reason`` (urllib3), exception
    arguments (requests wraps urllib3 errors in ``args``), ``__cause__``,
    ``__context__``."""
    seen: dict[int, BaseException] = {}
    queue = [exc]
    while queue and len(seen) < limit:
        node = queue.pop(0)
        if id(node) in seen:
            continue
        seen[id(node)] = node
        linked = [getattr(node, "reason", None), *node.args, node.__cause__, node.__context__]
        queue.extend(item for item in linked if isinstance(item, BaseException))
    return list(seen.values())


def _from_table(exc: BaseException, module: str, rows: tuple[_Row, ...]) -> _Row | None:
    lib = sys.modules.get(module)
    if lib is None:
        return None
    for name, where, reason in rows:
        cls = getattr(lib, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return name, where, reason
    return None


def _verdict(node: BaseException) -> tuple[Where | None, str] | None:
    row = _from_table(node, "httpx", _HTTPX) or _from_table(node, "requests.exceptions", _REQUESTS)
    if row is not None:
        return row[1], row[2]
    for cls, where, reason in _markers():
        if isinstance(node, cls):
            return where, reason
    if isinstance(node, OSError) and node.errno in _UNREACHABLE:
        return "not_sent", "network_unreachable"
    return None


def where_sent(exc: BaseException) -> tuple[Where, str] | None:
    """Whether the request behind ``exc`` can have left, with a reason token.

    The nearest recognised exception in the cause chain decides. requests'
    ``ConnectionError`` and ``SSLError`` defer to their causes and count as
    "maybe sent" when no cause is recognised. ``None`` when ``exc`` is not a
    transport failure this module knows.
    """
    chain = _chain(exc)
    deferred: str | None = None
    for node in chain:
        found = _verdict(node)
        if found is None:
            continue
        where, reason = found
        if where is None:
            deferred = deferred or reason
            continue
        deeper = [_verdict(other) for other in chain]
        sharp = [r for w, r in filter(None, deeper) if w == where and r in _SHARPER]
        return where, sharp[0] if sharp else reason
    return ("maybe_sent", deferred) if deferred else None


def _status_error(exc: BaseException, now: datetime | None, writes: bool) -> ToolFailure | None:
    # httpx.HTTPStatusError and requests.HTTPError both carry the response.
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(status, int) or isinstance(status, bool):
        return None
    headers = getattr(response, "headers", None)
    return classify_http(
        status, headers if isinstance(headers, Mapping) else None, now=now, writes=writes
    )


def classify_exception(
    exc: BaseException, *, writes: bool, now: datetime | None = None
) -> ToolFailure:
    """The ``ToolFailure`` for an exception an HTTP client (or socket) raised.

    Not sent -> ``Unavailable``. Maybe sent -> ``OutcomeUnknown`` for a write,
    ``Unavailable`` for a read. Misconfigured -> ``Misconfigured``. A
    ``ToolFailure`` is returned as it is; anything unrecognised becomes a bare
    ``ToolFailure`` that the table treats like any unexpected exception.
    """
    if isinstance(exc, ToolFailure):
        return exc
    from_status = _status_error(exc, now, writes)
    if from_status is not None:
        return from_status
    found = where_sent(exc)
    if found is None:
        return ToolFailure(code="OUTCOME_UNKNOWN" if writes else UPSTREAM_ERROR)
    where, reason = found
    if where == "misconfigured":
        return Misconfigured(reason=reason)
    if where == "maybe_sent" and writes:
        return OutcomeUnknown(reason=reason)
    code = "UPSTREAM_TIMEOUT" if reason.endswith("timeout") else None
    return Unavailable(code=code, reason=reason)
