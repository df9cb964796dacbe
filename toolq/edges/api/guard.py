"""Every HTTP error in one shape, and the guard that nothing escapes.

An error body is ``{"code", "message", "field_errors"?, "envelope"?}``. The
message is toolq's own (or the caller's own input, scrubbed), never the text
of an unexpected exception: those are logged and answered with
``{"code": "INTERNAL", "message": "internal error"}``.
"""

from __future__ import annotations

import http
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolq.core import errors
from toolq.core.envelope import ToolError, is_valid_code, to_dict
from toolq.core.redact import scrub
from toolq.edges.api.asgi import send_json
from toolq.process.waiting import Outage, Watch

log = logging.getLogger("toolq.api")

INTERNAL = {"code": "INTERNAL", "message": "internal error"}


class FieldErrorBody(BaseModel):
    field: str
    rule: str


class ErrorBody(BaseModel):
    """Every HTTP error: a stable ``code``, a short ``message``, and what applies."""

    code: str
    message: str
    field_errors: list[FieldErrorBody] | None = None
    envelope: dict[str, Any] | None = None


#: For ``responses=`` of every route, so the OpenAPI document names the shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody}
    for status in (400, 401, 403, 404, 409, 413, 414, 421, 422, 431, 500, 503)
}


class ApiError(Exception):
    """A refusal the API itself makes (authentication, scope)."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(code)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field_errors: list[dict[str, str]] | None = None,
    envelope: ToolError | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if field_errors:
        body["field_errors"] = field_errors
    if envelope is not None:
        body["envelope"] = to_dict(envelope)
    return JSONResponse(body, status_code=status, headers=headers)


_REFUSAL_STATUS: tuple[tuple[type[errors.RequestRefused], int], ...] = (
    (errors.UnknownTool, 404),
    (errors.OperationNotFound, 404),
    (errors.UnknownDependency, 404),
    (errors.InvalidArguments, 422),
    (errors.IdempotencyKeyReused, 422),
    (errors.InvalidState, 409),
)


def _refused(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.RequestRefused)
    status = next((s for cls, s in _REFUSAL_STATUS if isinstance(exc, cls)), 400)
    hint = exc.details.get("code_hint")
    code = hint if isinstance(hint, str) and is_valid_code(hint) else exc.code
    fields = [
        {"field": fe.field, "rule": fe.rule} for fe in getattr(exc, "field_errors", None) or []
    ]
    message = scrub(exc.message)[:280] or "refused"
    return error_response(status, code, message, field_errors=fields, envelope=exc.envelope)


def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = list(exc.errors())
    if any(p.get("type") == "json_invalid" for p in problems):
        return error_response(400, "MALFORMED_BODY", "the body is not valid JSON")
    fields = [
        {
            "field": scrub(".".join(str(x) for x in p.get("loc", ())))[:200] or "request",
            "rule": scrub(str(p.get("type", "invalid")))[:200] or "invalid",
        }
        for p in problems[:20]
    ]
    return error_response(
        422, "INVALID_REQUEST", "the request does not validate", field_errors=fields
    )


#: FastAPI's detail for a JSON body ``json.loads`` raised on with something other than
#: a JSONDecodeError: invalid UTF-8, nesting deeper than the parser goes, an integer
#: over Python's 4,300 digits. Malformed as much as ``{nope`` is, and said the same way.
_UNPARSED_BODY = "There was an error parsing the body"


def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _UNPARSED_BODY:
        return error_response(400, "MALFORMED_BODY", "the body is not JSON this API reads")
    try:
        phrase = http.HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "HTTP error"
    code = "_".join(phrase.upper().replace("-", " ").split()) or "HTTP_ERROR"
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, code, phrase.lower(), headers=headers)


def _api(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, headers=exc.headers)


def server_watch(probe: Callable[[], Awaitable[object]]) -> Watch:
    """The queue server's outages as the API and the console log them: one line when
    requests start failing, one when ``probe`` (``tq.aio.ping``) answers again."""
    outage = Outage("queue server", "ledger", meanwhile="answering 503 until it is back")
    return Watch(outage, probe, log)


def server_failed(watch: Watch, exc: Exception) -> None:
    """A request found the queue server away: ``watch`` says it once an outage, naming
    the server when ``exc`` is toolq's own error (never a bare RedisError's text)."""
    watch.failed(exc, str(exc) if isinstance(exc, errors.ServerUnavailable) else "")


def install(app: FastAPI, *, max_body: int, retry_after: float, watch: Watch) -> None:
    """Error handlers for every exception the routes may raise, and the guard."""

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        # tq.aio raises ServerUnavailable (its message names the server, for the
        # operator's logs: the caller gets only the code); a bare RedisError may
        # come from elsewhere (the status snapshot). Said once an outage (watch);
        # async: on the loop the watch's probe runs on.
        server_failed(watch, exc)
        return error_response(
            503,
            exc.code if isinstance(exc, errors.ServerUnavailable) else "QUEUE_UNAVAILABLE",
            "the queue's server did not answer; the same request again is safe",
            headers={"Retry-After": str(max(1, math.ceil(retry_after)))},
        )

    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(errors.RequestRefused, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(redis.RedisError, unavailable)
    app.add_exception_handler(errors.ServerUnavailable, unavailable)
    app.add_middleware(BodyLimitGuard, max_body=max_body)


#: What :meth:`BodyLimitGuard._read` returns for a client gone before its body ended.
_GONE = object()


class BodyLimitGuard:
    """Bounds request bodies (413) and turns any escaped exception into a bare 500.

    It sits inside Starlette's ServerErrorMiddleware, which would answer but
    then re-raise; nothing escapes this one. A body cut short (the client left
    before sending all of it) reaches no route: a write's arguments must not be
    what a connection happened to carry when it dropped.
    """

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if scope["method"] in ("POST", "PUT", "PATCH", "DELETE"):
                body = await self._read(scope, receive)
                if body is _GONE:
                    return  # no one to answer, nothing to act on
                if not isinstance(body, bytes):
                    message = f"the body is larger than {self.max_body} bytes"
                    await send_json(send, 413, {"code": "BODY_TOO_LARGE", "message": message})
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error serving %s", scope.get("method"))
            if not started:
                await send_json(send, 500, INTERNAL)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | object | None:
        """The whole body; None if it is over the limit, :data:`_GONE` if the client left."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE  # http.disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
