"""The FastAPI app factory and the routes (see :mod:`toolq.api` for the table).

No ``from __future__ import annotations`` here: FastAPI reads the routes'
annotations at runtime, and some of them (``Wait``, the ref headers) are built
per app.
"""

import contextlib
import math
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from toolq import errors
from toolq.api.auth import ApiSettings, Tokens, check_bind
from toolq.api.guard import ERROR_RESPONSES, ApiError, install
from toolq.api.hosts import HostGuard, allowed_hosts, wildcard_note
from toolq.envelope import ToolError, to_dict
from toolq.record import OperationRecord
from toolq.states import SETTLED, State

if TYPE_CHECKING:
    from toolq.queue import ToolQueue

DESCRIPTION = (
    "Run AI-agent tool calls through toolq's queues. A tool's failure is an envelope in a "
    "200 body; HTTP errors are about the request and have a stable `code`."
)


class OperationView(BaseModel):
    operation_ref: str
    tool: str
    state: State
    attempt: int
    max_attempts: int
    #: Nothing more is needed from the runtime (finished, or waiting on a person).
    settled: bool
    #: On invoke: whether this request created the operation.
    created: bool | None = None
    #: The latest envelope; a failed tool's envelope is here, with a 200.
    envelope: dict[str, Any] | None = None
    #: While not settled: seconds to wait before polling again (also ``Retry-After``).
    poll_interval: float | None = None
    created_at: datetime
    updated_at: datetime


_bearer = HTTPBearer(auto_error=False, description="A token from TOOLQ_API_TOKENS.")


def _require(scope: str) -> Any:
    def authorize(
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> None:
        tokens: Tokens = request.app.state.tokens
        refusal = tokens.check(request.headers.get("authorization"), scope)
        if refusal is not None:
            status, code, message = refusal
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            raise ApiError(status, code, message, headers=headers)

    return Depends(authorize)


RefPath = Annotated[str, Path(description="The operation_ref; it may contain '/'.")]
Arguments = Annotated[dict[str, Any], Body(description="The tool's arguments, a JSON object.")]


def create_app(
    tq: "ToolQueue", settings: ApiSettings | None = None, *, bind_host: str | None = None
) -> FastAPI:
    """The FastAPI app serving ``tq``; ``ValueError`` if the tokens are malformed.

    It answers only for loopback hosts, ``bind_host`` (the address it is served
    on, unless a wildcard) and ``settings.allowed_hosts`` (:mod:`toolq.api.hosts`).
    """
    from toolq import __version__

    settings = settings or ApiSettings()
    poll = settings.poll_interval
    app = FastAPI(title="toolq", version=__version__, description=DESCRIPTION)
    app.state.tokens = settings.token_table()
    max_body = settings.max_body_bytes or tq.settings.limits.max_args_bytes
    install(app, max_body=max_body, retry_after=poll)
    # Added last, so outermost: a refused Host or Origin reaches nothing else.
    app.add_middleware(HostGuard, allowed=allowed_hosts(bind_host, settings.allowed_hosts))
    Wait = Annotated[
        float, Query(ge=0, le=settings.max_wait, description="Seconds to wait for it to settle.")
    ]
    max_ref = tq.settings.limits.max_ref_length
    IdempotencyKey = Annotated[
        str,
        Header(
            alias="Idempotency-Key", max_length=max_ref, description="Becomes the operation_ref."
        ),
    ]
    CallId = Annotated[
        str | None,
        Header(alias="X-Call-Id", pattern=rf"^[\x21-\x7e]{{1,{max_ref}}}$", description="call_id"),
    ]

    def view(ref: str, status: int = 200, created: bool | None = None) -> JSONResponse:
        rec = tq.ledger.get(ref, with_history=False) if len(ref) <= max_ref else None
        if rec is None:
            raise errors.OperationNotFound("no such operation")
        return _view(rec, status, poll, created)

    route: dict[str, Any] = {"response_model": OperationView, "responses": ERROR_RESPONSES}

    @app.post(
        "/v1/tools/{name}:invoke", status_code=202, **route, dependencies=[_require("invoke")]
    )
    def invoke(
        name: Annotated[str, Path(max_length=64)],
        args: Arguments,
        idempotency_key: IdempotencyKey,
        call_id: CallId = None,
    ) -> JSONResponse:
        """Submit a tool call; follow it at ``Location``."""
        sub = tq.submit(name, args, operation_ref=idempotency_key, call_id=call_id)
        return view(sub.operation_ref, 202, sub.created)

    @app.get("/v1/operations/{ref:path}", **route, dependencies=[_require("read")])
    def get_operation(ref: RefPath, wait: Wait = 0) -> JSONResponse:
        """An operation's state, attempt and envelope; ``wait`` long-polls."""
        if wait > 0 and len(ref) <= max_ref:
            with contextlib.suppress(TimeoutError):
                tq.wait(ref, timeout=wait)
        return view(ref)

    @app.post("/v1/operations/{ref:path}:approve", **route, dependencies=[_require("approve")])
    def approve(ref: RefPath) -> JSONResponse:
        """Approve an operation awaiting approval; it runs with its current arguments."""
        tq.approve(ref)
        return view(ref)

    @app.post("/v1/operations/{ref:path}:input", **route, dependencies=[_require("input")])
    def provide_input(ref: RefPath, args: Arguments) -> JSONResponse:
        """Give an operation that needs input changed arguments; identical ones are refused."""
        tq.provide_input(ref, args)
        return view(ref)

    @app.post("/v1/operations/{ref:path}:cancel", **route, dependencies=[_require("cancel")])
    def cancel(ref: RefPath) -> JSONResponse:
        """Cancel an operation that has not started a write."""
        tq.cancel(ref)
        return view(ref)

    @app.get("/v1/tools", responses=ERROR_RESPONSES, dependencies=[_require("read")])
    def list_tools() -> dict[str, Any]:
        """Every registered tool, its input schema and whether it writes."""
        return {"tools": [_tool(t) for t in tq.registry]}

    @app.get("/v1/status", responses=ERROR_RESPONSES, dependencies=[_require("read")])
    def status() -> dict[str, Any]:
        """What ``toolq status --json`` shows."""
        from toolq.monitor import status_snapshot

        return status_snapshot(tq)

    @app.get("/v1/health", responses=ERROR_RESPONSES)
    def health() -> dict[str, bool]:
        """Whether the API reaches Redis; needs no token."""
        tq.redis.ping()
        return {"ok": True}

    return app


def _tool(t: Any) -> dict[str, Any]:
    return {
        "name": t.name,
        "description": t.options.description,
        "writes": t.writes,
        "idempotent": t.options.idempotent,
        "requires_approval": t.options.requires_approval,
        "verification_tool": t.verification_tool,
        "input_schema": t.input_schema(),
    }


def _view(rec: OperationRecord, status: int, poll: float, created: bool | None) -> JSONResponse:
    settled = rec.state in SETTLED
    body = OperationView(
        operation_ref=rec.operation_ref,
        tool=rec.tool,
        state=rec.state,
        attempt=rec.attempt,
        max_attempts=rec.max_attempts,
        settled=settled,
        created=created,
        envelope=to_dict(rec.envelope) if rec.envelope is not None else None,
        poll_interval=None if settled else poll,
        created_at=rec.created_at,
        updated_at=rec.updated_at,
    )
    headers: dict[str, str] = {}
    if status == 202:
        headers["Location"] = "/v1/operations/" + quote(rec.operation_ref, safe="/:@+=")
    if not settled:
        headers["Retry-After"] = str(_retry_after(rec, poll))
    content = body.model_dump(mode="json", exclude_none=True)
    return JSONResponse(content, status_code=status, headers=headers)


def _retry_after(rec: OperationRecord, poll: float) -> int:
    env = rec.envelope
    if rec.state is State.WAITING_RETRY and isinstance(env, ToolError) and env.retry.not_before:
        return max(1, math.ceil((env.retry.not_before - datetime.now(UTC)).total_seconds()))
    return max(1, math.ceil(poll))


def serve_api(
    tq: "ToolQueue",
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    settings: ApiSettings | None = None,
    log_level: str = "info",
) -> None:
    """Serve the API in the foreground (what ``toolq api`` and ``toolq up`` run).

    ``ValueError`` for malformed tokens, or a non-loopback host without tokens.
    """
    import uvicorn

    settings = settings or ApiSettings()
    app = create_app(tq, settings, bind_host=host)
    check_bind(host, app.state.tokens, "api")
    note = wildcard_note(host, settings.allowed_hosts, "api")
    if note is not None:
        print(note, file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), server_header=False)
