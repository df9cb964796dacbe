"""The HTTP API over a ToolQueue: ``toolq api`` (FastAPI + uvicorn).

Endpoints, all JSON; an operation ref may contain ``/`` (``run_81/step_4``)::

    POST /v1/tools/{name}:invoke          202 + Location: /v1/operations/{ref}   scope invoke
                                          ?wait=SECONDS: 200 if it settled by then
    GET  /v1/operations/{ref}             ?wait=SECONDS long-polls               scope read
    GET  /v1/operations/{ref}/events      Server-Sent Events until it settles    scope read
    POST /v1/operations/{ref}:approve     awaiting_approval -> queued            scope approve
    POST /v1/operations/{ref}:input       needs_input -> queued (body: args)     scope input
    POST /v1/operations/{ref}:cancel      queued or waiting -> cancelled         scope cancel
    POST /v1/operations/{ref}:retry       waiting_retry -> queued now            scope approve
    POST /v1/operations/{ref}:verify      verifying: the next check now          scope approve
    POST /v1/operations/{ref}:resolve     escalated -> succeeded, failed or      scope resolve
                                          queued (body: outcome, reason, ...)
    GET  /v1/operations?state=..          a page of a state's list (cursor)      scope read
    GET  /v1/deps                         every dependency key: limits, in       scope read
                                          flight, waiting, pause, breaker
    GET  /v1/deps/{key}                   one key, with operators' actions       scope read
    POST /v1/deps/{key}:lift              end its pause; held-back calls go now  scope resolve
    POST /v1/deps/{key}:close             close its breaker (body: reason)       scope resolve
    GET  /v1/tools                        each tool's input schema, writes       scope read
    GET  /v1/status                       ``toolq status --json``, plus overview scope read
    GET  /v1/health                       Redis answers; no token needed (HEAD too)
    GET  /openapi.json, /docs, /redoc     the OpenAPI document; the docs pages load
                                          nothing from the network
    GET  /ui/                             the operator's console (:mod:`toolq.edges.api.console`):
                                          log in with a token; pages, actions, live

The ``Idempotency-Key`` header is the operation_ref (``X-Call-Id`` the
optional call_id): the same key with the same arguments returns the same
operation; with other arguments it is a 422 whose body carries the
``IDEMPOTENCY_KEY_REUSED`` envelope. A tool failing is not an HTTP failure:
its envelope comes back in a 200 body. HTTP errors are about the request, and
their body is always ``{"code", "message", "field_errors"?, "envelope"?}``;
an unexpected error is ``{"code": "INTERNAL", "message": "internal error"}``.
While an operation is not settled, responses carry ``Retry-After`` and
``poll_interval``.

Every route that touches the ledger is ``async`` on ``tq.aio``: a ``?wait=``
long-poll or an event stream holds no thread, so waiting agents never starve
``/v1/health`` or anyone else. The event stream (:mod:`toolq.edges.api.events`)
sends one ``state`` event per history entry (the event id is its index, so a
reconnect with ``Last-Event-ID`` resumes without loss or repeat), ``progress``
events, then the final ``envelope``.

Settings (:class:`ApiSettings`, env prefix ``TOOLQ_API_``)::

    TOOLQ_API_TOKENS="<agent-token>=invoke,read;<operator-token>=approve,input,cancel,read"
    TOOLQ_API_MAX_WAIT=30          longest ?wait= (s)
    TOOLQ_API_POLL_INTERVAL=1      what pending operations tell pollers (s)
    TOOLQ_API_KEEPALIVE=15         seconds between an event stream's keep-alive comments
    TOOLQ_API_MAX_BODY_BYTES=...   413 above this (default: TOOLQ_LIMITS__MAX_ARGS_BYTES)
    TOOLQ_API_ALLOWED_HOSTS=api,toolq.internal   Host names answered besides loopback
    TOOLQ_API_MAX_URL_BYTES=4096   414 for a longer path and query, before any work
    TOOLQ_API_MAX_HEADER_BYTES=8192   431 for larger headers (:mod:`toolq.edges.api.sizes`)
    TOOLQ_API_REQUEST_TIMEOUT=10   408 for a request not in whole by then (slow clients)

Scopes: ``read``, ``invoke``, ``approve``, ``input``, ``cancel``, ``resolve``;
``*`` is all of them. Tokens are at least 16 characters and compared in constant time.
Without tokens there is no authentication, so :func:`serve_api` binds
loopback only and refuses any other host.

Against DNS rebinding (:mod:`toolq.edges.api.hosts`), every request's ``Host`` must
be ``localhost``, ``127.0.0.1``, ``[::1]``, the specific address it is bound to
(not ``0.0.0.0``) or a name in ``TOOLQ_API_ALLOWED_HOSTS``, on any port: else
421 ``HOST_NOT_ALLOWED``. A request with an ``Origin`` naming any other host is
refused, 403 ``ORIGIN_NOT_ALLOWED``. Bound to ``0.0.0.0``, list the names
clients use.
"""

from typing import TYPE_CHECKING, Any

from toolq.edges.api.auth import SCOPES, ApiSettings, Tokens

if TYPE_CHECKING:
    from toolq.edges.api.app import create_app, serve_api

__all__ = ["SCOPES", "ApiSettings", "Tokens", "create_app", "serve_api"]


def __getattr__(name: str) -> Any:
    # FastAPI is the ``api`` extra: import it only when the app is asked for, so
    # the MCP server can share the token code without it.
    if name in ("create_app", "serve_api"):
        from toolq.edges.api import app

        return getattr(app, name)
    raise AttributeError(f"module 'toolq.api' has no attribute {name!r}")
