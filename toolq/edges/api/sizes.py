"""Request lines and headers over a limit are refused before any work (414, 431),
and a request that does not arrive in time is not waited for (408).

Three bounds, for the HTTP API and the MCP server's HTTP transport alike:

- uvicorn's HTTP parser (h11) holds at most :func:`parser_buffer` bytes of a
  request head that has not ended: a 1 MB request line is answered 400 and
  closed after its first tens of KB, never buffered or parsed whole;
- :class:`SizeGuard`, the outermost middleware, answers a request whose path
  and query, or whose headers, are over :class:`~toolq.edges.api.auth.ApiSettings`'
  ``max_url_bytes`` / ``max_header_bytes`` with 414 ``URI_TOO_LONG`` / 431
  ``HEADERS_TOO_LARGE``, before the host check, routing or any handler;
- :func:`protocol`: a request, head and body, must arrive within
  ``request_timeout`` seconds of its connection opening (or of the previous
  response on it ending); else 408 ``REQUEST_TIMEOUT`` and the connection is
  closed. uvicorn waits for a head forever, so one slow client per file
  descriptor (slowloris) froze the API for everyone once the process ran out of
  them: 250 connections sending half a header did under ``ulimit -n 200``.

No ASGI framework is needed here: the MCP server uses it without FastAPI.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from toolq.edges.api.asgi import Guard, Refusal

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Scope

    from toolq.edges.api.auth import ApiSettings

#: What the request line holds besides its target ("GET ", " HTTP/1.1\r\n") and
#: the head's end, with room to spare.
_HEAD_SLACK = 1024


def parser_buffer(settings: ApiSettings) -> int:
    """h11's ``max_incomplete_event_size``: a head the guard may still refuse fits."""
    return settings.max_url_bytes + settings.max_header_bytes + _HEAD_SLACK


class SizeGuard(Guard):
    """414 for a path and query over ``max_url``, 431 for headers over ``max_headers``,
    400 for a request framed both by a length and by chunks."""

    ws_close_code = 1009  # message too big
    #: Whatever else the client sends on this connection is not read.
    refused_headers = ((b"connection", b"close"),)

    def __init__(self, app: ASGIApp, *, max_url: int, max_headers: int) -> None:
        self.app, self.max_url, self.max_headers = app, max_url, max_headers

    def refusal(self, scope: Scope) -> Refusal | None:
        path = scope.get("raw_path") or scope.get("path", "").encode()
        if len(path) + len(scope.get("query_string", b"")) > self.max_url:
            return 414, {
                "code": "URI_TOO_LONG",
                "message": f"the path and query are longer than {self.max_url} bytes",
            }
        headers = scope.get("headers", ())
        names = {k.lower() for k, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            # Framed two ways: h11 reads the chunks, a proxy in front may have read the
            # length, and what is left of one is the next request for the other
            # (request smuggling). RFC 9112 6.1: a server may refuse it; closed after.
            return 400, {
                "code": "MALFORMED_REQUEST",
                "message": "the request has both Content-Length and Transfer-Encoding",
            }
        # As sent: "name: value\r\n" per header.
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.max_headers:
            return 431, {
                "code": "HEADERS_TOO_LARGE",
                "message": f"the headers are larger than {self.max_headers} bytes",
            }
        return None


def guarded(app: ASGIApp, settings: ApiSettings) -> SizeGuard:
    return SizeGuard(app, max_url=settings.max_url_bytes, max_headers=settings.max_header_bytes)


def timeout_answer(seconds: float) -> bytes:
    """The whole 408 response: written as it is, since no request may have begun."""
    body = json.dumps(
        {
            "code": "REQUEST_TIMEOUT",
            "message": f"the request did not arrive within {seconds:g} s",
        }
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


#: The body of the 400 for bytes that are not an HTTP/1.1 request (h11 refused them).
MALFORMED = json.dumps(
    {"code": "MALFORMED_REQUEST", "message": "the request is not valid HTTP/1.1"}
).encode()


def protocol(settings: ApiSettings) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, with a deadline for each request to arrive whole, and
    JSON (:data:`MALFORMED`) for a request h11 cannot parse, where uvicorn's is text.

    The deadline starts when the connection opens and again when a response on it
    ends; it is lifted once the request's head and body are in (a long-poll or an
    event stream then holds its connection as long as it needs). Past it, a client
    that sent part of a request gets a 408, one that sent nothing is just closed
    (as uvicorn's keep-alive timeout does), and the connection is closed.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    timeout = settings.request_timeout
    answer = timeout_answer(timeout)
    # A request with an Upgrade header (curl --http2 sends "Upgrade: h2c") is in whole
    # at MIGHT_SWITCH_PROTOCOL, not DONE: without it here, its long-poll or event stream
    # would be cut at the deadline.
    arrived = (
        h11.DONE,
        h11.MIGHT_SWITCH_PROTOCOL,  # type: ignore[attr-defined]  # public, not in __all__
        h11.SWITCHED_PROTOCOL,
        h11.MUST_CLOSE,
        h11.CLOSED,
        h11.ERROR,
    )

    class Bounded(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._lift_if_arrived()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()
            self._lift_if_arrived()  # a pipelined request may be in already

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._lift()  # the connection is the websocket's now
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc: Exception | None) -> None:
            self._lift()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # A target with raw non-ASCII bytes, no Host, two Hosts, a head over the
            # parser's buffer: every refusal of ours has a JSON body with a code.
            self._lift()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(MALFORMED)).encode()),
                (b"connection", b"close"),
            ]
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=MALFORMED),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def _arm(self) -> None:
            self._lift()
            if not self.transport.is_closing():
                self._deadline = self.loop.call_later(timeout, self._expired)

        def _lift(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _lift_if_arrived(self) -> None:
            if self.conn.their_state in arrived:
                self._lift()

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            between = self.conn.their_state is h11.IDLE
            if between and not self.conn.trailing_data[0]:
                pass  # nothing sent: an idle connection, closed without a word
            elif between or cycle is None or not cycle.response_started:
                self.transport.write(answer)
            # A route waiting for the body sees the client leave (and does nothing).
            self.transport.close()

    return Bounded


def run(app: Any, settings: ApiSettings, *, host: str, port: int, log_level: str) -> None:
    """``uvicorn.run`` with the parser and the wait for a request bounded; ``app`` should
    be :func:`guarded` already."""
    import uvicorn

    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        server_header=False,
        # h11, even where httptools is installed: its buffer bound is what keeps a
        # megabyte-long head from being read (and parsed) whole.
        http=protocol(settings),
        h11_max_incomplete_event_size=parser_buffer(settings),
    )
