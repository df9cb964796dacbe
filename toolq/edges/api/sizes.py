"""Request lines and headers over a limit are refused before any work (414, 431).

Two bounds, for the HTTP API and the MCP server's HTTP transport alike:

- uvicorn's HTTP parser (h11) holds at most :func:`parser_buffer` bytes of a
  request head that has not ended: a 1 MB request line is answered 400 and
  closed after its first tens of KB, never buffered or parsed whole;
- :class:`SizeGuard`, the outermost middleware, answers a request whose path
  and query, or whose headers, are over :class:`~toolq.edges.api.auth.ApiSettings`'
  ``max_url_bytes`` / ``max_header_bytes`` with 414 ``URI_TOO_LONG`` / 431
  ``HEADERS_TOO_LARGE``, before the host check, routing or any handler.

No ASGI framework is needed here: the MCP server uses it without FastAPI.
"""

from __future__ import annotations

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
    """414 for a path and query over ``max_url``, 431 for headers over ``max_headers``."""

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
        # As sent: "name: value\r\n" per header.
        size = sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))
        if size > self.max_headers:
            return 431, {
                "code": "HEADERS_TOO_LARGE",
                "message": f"the headers are larger than {self.max_headers} bytes",
            }
        return None


def guarded(app: ASGIApp, settings: ApiSettings) -> SizeGuard:
    return SizeGuard(app, max_url=settings.max_url_bytes, max_headers=settings.max_header_bytes)


def run(app: Any, settings: ApiSettings, *, host: str, port: int, log_level: str) -> None:
    """``uvicorn.run`` with the parser bounded; ``app`` should be :func:`guarded` already."""
    import uvicorn

    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        server_header=False,
        # h11, even where httptools is installed: its buffer bound is what keeps a
        # megabyte-long head from being read (and parsed) whole.
        http="h11",
        h11_max_incomplete_event_size=parser_buffer(settings),
    )
