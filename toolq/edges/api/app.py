"""The FastAPI app factory and the routes (see :mod:`toolq.edges.api` for the table).

No ``from __future__ import annotations`` here: FastAPI reads the routes'
annotations at runtime, and some of them (``Wait``, the ref headers) are built
per app.
"""

import contextlib
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from toolq.adapters.ledger.dep_state import DepActed, DepDetail
from toolq.core import errors
from toolq.core.record import OperationPage
from toolq.core.states import SETTLED
from toolq.edges.api.auth import ApiSettings, Tokens, actor_of, check_bind
from toolq.edges.api.console import install_console
from toolq.edges.api.docs import install_docs
from toolq.edges.api.events import EventStream, open_stream
from toolq.edges.api.guard import (
    ERROR_RESPONSES,
    ApiError,
    install,
    server_failed,
    server_watch,
)
from toolq.edges.api.hosts import HostGuard, allowed_hosts, wildcard_note
from toolq.edges.api.sizes import SizeGuard
from toolq.edges.api.views import (
    DepActionRequest,
    DepList,
    OperationView,
    ResolveRequest,
    tool_view,
    view_response,
)

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

DESCRIPTION = (
    "Run AI-agent tool calls through toolq's queues. A tool's failure is an envelope in a "
    "200 body; HTTP errors are about the request and have a stable `code`."
)

_bearer = HTTPBearer(auto_error=False, description="A token from TOOLQ_API_TOKENS.")


def _require(scope: str) -> Any:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, and every
    # request passes here.
    async def authorize(
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


async def _actor(request: Request) -> str:
    # The history's "by" for an operator action: the token, by its fingerprint.
    tokens: Tokens = request.app.state.tokens
    return actor_of(tokens, request.headers.get("authorization"), "api")


By = Annotated[str, Depends(_actor)]
RefPath = Annotated[str, Path(description="The operation_ref; it may contain '/'.")]
Arguments = Annotated[dict[str, Any], Body(description="The tool's arguments, a JSON object.")]


def create_app(
    tq: "ToolQueue", settings: ApiSettings | None = None, *, bind_host: str | None = None
) -> FastAPI:
    """The FastAPI app serving ``tq``; ``ValueError`` if the tokens are malformed.

    It answers only for loopback hosts, ``bind_host`` (the address it is served
    on, unless a wildcard) and ``settings.allowed_hosts`` (:mod:`toolq.edges.api.hosts`).
    Every route that reads or writes the ledger is ``async`` on ``tq.aio``: a
    long-poll or an event stream holds no thread.
    """
    from toolq import __version__

    settings = settings or ApiSettings()
    poll = settings.poll_interval
    watch = server_watch(lambda: tq.aio.ping())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await watch.close()

    app = FastAPI(
        title="toolq",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.tokens = settings.token_table()
    max_body = settings.max_body_bytes or tq.settings.limits.max_args_bytes
    install(app, max_body=max_body, retry_after=poll, watch=watch)
    install_docs(app)
    install_console(app, tq, settings, watch)
    # Added last, so outermost: an oversized request, then a refused Host or Origin,
    # reaches nothing else.
    app.add_middleware(HostGuard, allowed=allowed_hosts(bind_host, settings.allowed_hosts))
    app.add_middleware(
        SizeGuard, max_url=settings.max_url_bytes, max_headers=settings.max_header_bytes
    )
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
    LastEventId = Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            description="Resume after this event id (a history index), as EventSource sends it.",
        ),
    ]

    async def view(ref: str, status: int = 200, created: bool | None = None) -> JSONResponse:
        rec = await tq.aio.get(ref) if len(ref) <= max_ref else None
        if rec is None:
            raise errors.OperationNotFound("no such operation")
        return view_response(rec, status, poll, created)

    route: dict[str, Any] = {"response_model": OperationView, "responses": ERROR_RESPONSES}

    @app.post(
        "/v1/tools/{name}:invoke", status_code=202, **route, dependencies=[_require("invoke")]
    )
    async def invoke(
        request: Request,
        name: Annotated[str, Path(max_length=64)],
        args: Arguments,
        idempotency_key: IdempotencyKey,
        call_id: CallId = None,
        wait: Wait = 0,
    ) -> JSONResponse:
        """Submit a tool call; follow it at ``Location``. With ``wait``, wait up to that
        long (bounded as ``GET``'s) for it to settle: 200 with its envelope if it did, else
        202 as without. A repeat (the same Idempotency-Key) waits the same way."""
        _single(request, "Idempotency-Key", "X-Call-Id")
        sub = await tq.aio.submit(name, args, operation_ref=idempotency_key, call_id=call_id)
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await tq.aio.wait(sub.operation_ref, timeout=wait)
            rec = await tq.aio.get(sub.operation_ref)
            if rec is not None and rec.state in SETTLED:
                return view_response(rec, 200, poll, sub.created)
        return await view(sub.operation_ref, 202, sub.created)

    # Before the operation route, whose ``{ref:path}`` would take ``.../events`` too.
    # The price: a ref whose last segment is ``events`` cannot be read with GET
    # (that path is the stream of the ref before it); its stream ends with its view.
    @app.get(
        "/v1/operations/{ref:path}/events",
        # No media type of its own, so that the errors are documented as JSON; the
        # 200 is documented below.
        response_class=Response,
        responses={
            200: {
                "description": "Server-Sent Events: state, progress, then envelope; the "
                "stream ends once the operation has settled.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            **ERROR_RESPONSES,
        },
        dependencies=[_require("read")],
    )
    async def operation_events(ref: RefPath, last_event_id: LastEventId = None) -> EventStream:
        """Each state the operation enters, its progress, then its envelope (SSE).

        The event id is the history index: reconnecting with ``Last-Event-ID``
        resumes after it, with nothing lost or repeated.
        """
        return await open_stream(
            tq.aio,
            ref,
            last_event_id,
            keepalive=settings.keepalive,
            poll=poll,
            max_ref=max_ref,
            away=lambda exc: server_failed(watch, exc),
        )

    @app.get("/v1/operations/{ref:path}", **route, dependencies=[_require("read")])
    async def get_operation(ref: RefPath, wait: Wait = 0) -> JSONResponse:
        """An operation's state, attempt and envelope; ``wait`` long-polls."""
        if wait > 0 and len(ref) <= max_ref:
            with contextlib.suppress(TimeoutError):
                await tq.aio.wait(ref, timeout=wait)
        return await view(ref)

    @app.post("/v1/operations/{ref:path}:approve", **route, dependencies=[_require("approve")])
    async def approve(ref: RefPath, by: By) -> JSONResponse:
        """Approve an operation awaiting approval; it runs with its current arguments."""
        await tq.aio.approve(ref, by=by)
        return await view(ref)

    @app.post("/v1/operations/{ref:path}:input", **route, dependencies=[_require("input")])
    async def provide_input(ref: RefPath, args: Arguments, by: By) -> JSONResponse:
        """Give an operation that needs input changed arguments; identical ones are refused."""
        await tq.aio.provide_input(ref, args, by=by)
        return await view(ref)

    @app.post("/v1/operations/{ref:path}:cancel", **route, dependencies=[_require("cancel")])
    async def cancel(ref: RefPath, by: By) -> JSONResponse:
        """Cancel an operation that has not started a write."""
        await tq.aio.cancel(ref, by=by)
        return await view(ref)

    # Retry now and verify now hasten work a person decides on, as approving does:
    # they take the approve scope (so do the console's buttons), not a scope of their own.
    @app.post("/v1/operations/{ref:path}:retry", **route, dependencies=[_require("approve")])
    async def retry_now(ref: RefPath, by: By) -> JSONResponse:
        """Dispatch an operation waiting to retry now: the same operation_ref, one more
        attempt counted (escalated if its budget is spent). 409 in any other state."""
        await tq.aio.retry_now(ref, by=by)
        return await view(ref)

    @app.post("/v1/operations/{ref:path}:verify", **route, dependencies=[_require("approve")])
    async def verify_now(ref: RefPath, by: By) -> JSONResponse:
        """Check an operation in verifying now, not at its next check. 409 in any other
        state, or while a check of it runs."""
        await tq.aio.verify_now(ref, by=by)
        return await view(ref)

    # Settling an escalated write is a person's word about the provider: a scope of
    # its own (resolve), which an approver's token does not carry unless given it.
    @app.post("/v1/operations/{ref:path}:resolve", **route, dependencies=[_require("resolve")])
    async def resolve(ref: RefPath, body: ResolveRequest, by: By) -> JSONResponse:
        """Settle an escalated operation after checking the provider: ``committed``
        (succeeded, ``evidence_ref`` ``operator:<who>``), ``not_committed`` (failed) or
        ``retry`` (one attempt more, same operation_ref, within the operator budget).
        409 in any other state, past the budget, or if ``rev`` is not the current one."""
        await tq.aio.resolve(
            ref,
            body.outcome,
            reason=body.reason,
            result=body.result,
            reference=body.reference,
            rev="" if body.rev is None else body.rev,
            by=by,
        )
        return await view(ref)

    # Dependency keys: what the limiter holds now, and an operator settling a key. Lifting
    # a pause or closing a breaker is a person's word about a provider, as resolving is:
    # the resolve scope.
    DepKey = Annotated[
        str, Path(max_length=128, description="A dependency key, e.g. stripe or stripe:acct_1.")
    ]
    deps_route: dict[str, Any] = {"responses": ERROR_RESPONSES}

    @app.get("/v1/deps", response_model=DepList, **deps_route, dependencies=[_require("read")])
    async def list_deps() -> DepList:
        """Every dependency key the ledger has limited: its limits, calls in flight and
        waiting, its pause, its breaker and its counters."""
        return DepList(deps=await tq.aio.deps.list())

    @app.post(
        "/v1/deps/{key}:lift",
        response_model=DepActed,
        **deps_route,
        dependencies=[_require("resolve")],
    )
    async def lift_dep(key: DepKey, body: DepActionRequest, by: By) -> DepActed:
        """End the key's shared backoff now; the calls it held back go now (spread over a
        moment). 409 ``NOT_PAUSED`` if it is not paused, 404 for a key never used."""
        return await tq.aio.deps.lift(key, reason=body.reason, by=by)

    @app.post(
        "/v1/deps/{key}:close",
        response_model=DepActed,
        **deps_route,
        dependencies=[_require("resolve")],
    )
    async def close_dep(key: DepKey, body: DepActionRequest, by: By) -> DepActed:
        """Close the key's open or half-open breaker (its failures forgotten); the calls it
        held back go now. 409 ``BREAKER_CLOSED`` if it is closed."""
        return await tq.aio.deps.close(key, reason=body.reason, by=by)

    @app.get(
        "/v1/deps/{key}", response_model=DepDetail, **deps_route, dependencies=[_require("read")]
    )
    async def get_dep(key: DepKey) -> DepDetail:
        """One dependency key, with the operators' last actions on it (422 for a key of
        the wrong shape, 404 for one never used)."""
        return await tq.aio.deps.show(key)

    @app.get(
        "/v1/operations",
        response_model=OperationPage,
        responses=ERROR_RESPONSES,
        dependencies=[_require("read")],
    )
    async def list_operations(
        state: Annotated[
            str | None, Query(description="The state listed, e.g. waiting_retry; none: all.")
        ] = None,
        tool: Annotated[str | None, Query(max_length=64)] = None,
        code: Annotated[str | None, Query(max_length=64, description="Envelope code.")] = None,
        ref_contains: Annotated[str | None, Query(max_length=max_ref)] = None,
        older_than: Annotated[
            float | None, Query(ge=0, description="Only those in the state this many seconds.")
        ] = None,
        cursor: Annotated[str | None, Query(max_length=1024)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        order: Annotated[Literal["oldest", "newest"], Query()] = "oldest",
        q: Annotated[
            str | None, Query(description="Search: a part of a ref, or of a tool's name.")
        ] = None,
    ) -> OperationPage:
        """Operations in a state (or in every state), a page at a time (``next_cursor``
        continues, ``prev_cursor`` goes back).

        ``total`` counts the list when only ``tool``/``older_than`` filter it; with
        ``code``, ``ref_contains`` or ``q`` a page examines a bounded number of entries
        and says ``partial`` when it stopped before it was full.
        """
        return await tq.aio.list_operations(
            state,
            tool=tool,
            code=code,
            ref_contains=ref_contains,
            older_than_s=older_than,
            cursor=cursor,
            limit=limit,
            newest_first=order == "newest",
            search=q,
        )

    @app.get("/v1/tools", responses=ERROR_RESPONSES, dependencies=[_require("read")])
    async def list_tools() -> dict[str, Any]:
        """Every registered tool, its input schema and whether it writes."""
        return {"tools": [tool_view(t) for t in tq.registry]}

    @app.get("/v1/status", responses=ERROR_RESPONSES, dependencies=[_require("read")])
    async def status() -> dict[str, Any]:
        """What ``toolq status --json`` shows, and the console's overview adds
        (``pending``, ``rates``, ``scheduler.lag_s``): read on the event loop, the
        workers from their heartbeats."""
        from toolq.edges.monitor import overview

        return await overview(tq.aio)

    @app.get("/v1/trust", responses=ERROR_RESPONSES, dependencies=[_require("read")])
    async def trust(window: Literal["1h", "24h", "7d"] = "1h") -> dict[str, Any]:
        """The trust figures per tool over ``window`` (``1h``, ``24h`` or ``7d``):
        unknown outcomes and how verification resolved them, duplicates the ledger
        prevented, time in each recovery state (p50/p95), escalations and operator
        resolutions, from the scheduler's samples and the ledger's counters now."""
        from toolq.edges.monitor import trust as read_trust

        return await read_trust(tq.aio, window)

    @app.get("/v1/health", responses=ERROR_RESPONSES)
    async def health() -> dict[str, bool]:
        """Whether the API reaches Redis; needs no token."""
        await tq.aio.ping()  # a RedisError is the 503
        return {"ok": True}

    # Uptime checkers often ask with HEAD (FastAPI adds it to no GET route): a 405 read
    # as "down". Left out of the OpenAPI document, as GET says the same.
    app.add_api_route("/v1/health", health, methods=["HEAD"], include_in_schema=False)

    return app


def _single(request: Request, *names: str) -> None:
    """A header that names the operation may be sent once: with two, FastAPI took the
    first, and which operation was meant is a guess."""
    sent = [n for n in names if len(request.headers.getlist(n)) > 1]
    if sent:
        raise RequestValidationError(
            [{"type": "single_header", "loc": ("header", n)} for n in sent]
        )


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
    from toolq.edges.api import sizes

    settings = settings or ApiSettings()
    app = create_app(tq, settings, bind_host=host)
    check_bind(host, app.state.tokens, "api")
    note = wildcard_note(host, settings.allowed_hosts, "api")
    if note is not None:
        print(note, file=sys.stderr)
    sizes.run(app, settings, host=host, port=port, log_level=log_level)
