"""The console's pages and actions: a Starlette app mounted at ``/ui``.

See :mod:`toolq.api.console` for the routes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from toolq import errors, monitor
from toolq.api.auth import ApiSettings, Tokens, token_id
from toolq.api.console import forms, present
from toolq.api.console.session import (
    COOKIE,
    CSRF_FIELD,
    ConsoleSettings,
    Session,
    Signer,
    cross_site_refusal,
    signing_key,
)
from toolq.api.console.web import (
    STATIC,
    NeedsLogin,
    Refusal,
    SecurityHeaders,
    Visitor,
    Web,
    base_path,
    json_answer,
    local_url,
    wants_json,
    with_query,
)
from toolq.api.events import open_stream
from toolq.api.guard import ApiError
from toolq.recovery.operator import CANCELLABLE
from toolq.redact import scrub
from toolq.scheduler.series import COUNTED, GAUGED
from toolq.states import State

if TYPE_CHECKING:
    from toolq.queue import ToolQueue

log = logging.getLogger("toolq.console")

#: Refs one bulk action may carry (a page holds at most this many rows).
MAX_BULK = 500
PAGE_SIZES = (25, 50, 100, 200)
#: Hours the overview's charts cover.
CHART_HOURS = 3.0


@dataclass(frozen=True)
class Action:
    """An operator action: its button, the scope it needs, the states it applies to."""

    name: str
    label: str
    scope: str
    states: tuple[State, ...]
    #: How a flash message says it was done.
    done: str
    bulk: bool = True


#: Retry now and verify now change when the operation runs next, as approving
#: does: they take the approve scope (the API has no scope of their own).
ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("approve", "Approve", "approve", (State.AWAITING_APPROVAL,), "approved"),
        Action("retry", "Retry now", "approve", (State.WAITING_RETRY,), "due now"),
        Action("verify", "Verify now", "approve", (State.VERIFYING,), "checked now", bulk=False),
        Action("cancel", "Cancel", "cancel", CANCELLABLE, "cancelled"),
    )
}


def actions_for(state: State, bulk: bool = False) -> list[Action]:
    """The actions that apply to ``state`` (and, for bulk, may be done to many at once)."""
    return [a for a in ACTIONS.values() if state in a.states and (a.bulk or not bulk)]


class Console:
    """One console over ``tq``: its :meth:`app` is mounted at ``/ui``."""

    def __init__(
        self,
        tq: ToolQueue,
        api: ApiSettings,
        tokens: Tokens,
        settings: ConsoleSettings | None = None,
    ) -> None:
        self.tq = tq
        self.api = api
        self.settings = settings or ConsoleSettings()
        secret = self.settings.session_secret
        signer = Signer(signing_key(tokens, secret.get_secret_value() if secret else None))
        self.web = Web(tokens, self.settings, signer)
        self.max_ref = tq.settings.limits.max_ref_length

    def app(self) -> Starlette:
        g = self._guarded
        routes = [
            Route("/", g(self.overview)),
            Route("/overview/live", g(self.overview, live=True)),
            Route("/operations", g(self.operations)),
            Route("/operations/live", g(self.operations, live=True)),
            Route("/operation", g(self.operation)),
            Route("/operation/live", g(self.operation, live=True)),
            Route("/events", g(self.events, live=True)),
            Route("/login", g(self.login_form), methods=["GET"]),
            Route("/login", g(self.login, unsafe=True), methods=["POST"]),
            Route("/logout", g(self.logout, unsafe=True), methods=["POST"]),
            Route("/actions/input", g(self.provide_input, unsafe=True), methods=["POST"]),
            Route("/actions/bulk", g(self.bulk, unsafe=True), methods=["POST"]),
            Route("/actions/{action}", g(self.act, unsafe=True), methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
        return Starlette(
            routes=routes,
            middleware=[Middleware(SecurityHeaders)],
            exception_handlers={HTTPException: self._http_error},
        )

    # ------------------------------------------------------------------ guard

    def _guarded(
        self,
        handler: Callable[[Request], Awaitable[Response]],
        *,
        live: bool = False,
        unsafe: bool = False,
    ) -> Callable[[Request], Awaitable[Response]]:
        """Every handler's refusals and failures as pages (JSON for the page's script)."""
        web = self.web

        async def endpoint(request: Request) -> Response:
            quiet = live or wants_json(request)
            try:
                if unsafe:
                    why = cross_site_refusal(request.headers, request.headers.get("host"))
                    if why is not None:
                        raise Refusal(403, "Refused", f"Refused: {why}.")
                return await handler(request)
            except NeedsLogin:
                if quiet:
                    return json_answer(False, "log in again", 401)
                login = f"{base_path(request)}/login"
                if unsafe:  # a form posted after the session ended: nothing was done
                    return web.redirect(request, login, [("error", "Log in again.")])
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return web.redirect(request, with_query(login, next=target))
            except Refusal as exc:
                if quiet:
                    return json_answer(False, exc.message, exc.status)
                return self._error(request, exc.status, exc.title, exc.message)
            except HTTPException as exc:
                # Starlette's own refusals from inside a handler (a form it cannot
                # parse: 400), not a failure of ours.
                if quiet:
                    return json_answer(False, "the request could not be read", exc.status_code)
                return await self._http_error(request, exc)
            except (errors.ServerUnavailable, redis.RedisError) as exc:
                log.warning("console: queue server unavailable: %s", type(exc).__name__)
                message = "The queue's server did not answer. The page tries again by itself."
                if quiet:
                    return json_answer(False, message, 503)
                return self._error(request, 503, "Server unavailable", message)
            except Exception:
                log.exception("console: unhandled error serving %s", request.url.path)
                if quiet:
                    return json_answer(False, "internal error", 500)
                return self._error(request, 500, "Internal error", "Something went wrong.")

        return endpoint

    def _error(self, request: Request, status: int, title: str, message: str) -> Response:
        return self.web.page(
            request,
            "error.html",
            {"title": title, "message": message, "status": status},
            visitor=self._maybe_visitor(request),
            status=status,
        )

    def _maybe_visitor(self, request: Request) -> Visitor | None:
        try:
            return self.web.visitor(request, None)
        except (NeedsLogin, Refusal):
            return None

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return self._error(request, 404, "Not found", "There is no such page.")
        if exc.status_code == 405:
            return self._error(request, 405, "Not allowed", "That method is not allowed here.")
        return self._error(request, exc.status_code, "Error", "The request could not be served.")

    def _check_csrf(self, session: Session | None, form: Any) -> None:
        given = form.get(CSRF_FIELD)
        if not self.web.signer.csrf_ok(session, given if isinstance(given, str) else None):
            raise Refusal(
                403,
                "Refused",
                "Refused: the form is out of date or did not come from this console "
                "(reload the page and try again).",
            )

    async def _form_visitor(self, request: Request, scope: str | None) -> tuple[Visitor, Any]:
        """The visitor of a state-changing request and its form, CSRF checked."""
        visitor = self.web.visitor(request, None)
        form = await request.form(max_files=0, max_fields=MAX_BULK + 200)
        self._check_csrf(visitor.session, form)
        if scope is not None and not visitor.may(scope):
            raise Refusal(403, "Not allowed", f"Your token does not have the {scope} scope.")
        return visitor, form

    # ------------------------------------------------------------------ login

    async def login_form(self, request: Request) -> Response:
        if not self.web.tokens:
            return self.web.redirect(request, f"{base_path(request)}/")
        session, cookie = self.web.anonymous(request)
        response = self.web.page(
            request,
            "login.html",
            {"title": "Log in", "next": request.query_params.get("next", ""), "error": ""},
            csrf=self.web.signer.csrf(session),
        )
        if cookie:
            self.web.set_session(request, response, cookie)
        return response

    async def login(self, request: Request) -> Response:
        web = self.web
        base = base_path(request)
        form = await request.form(max_files=0, max_fields=10)
        session = web.signer.read(request.cookies.get(COOKIE), time.time())
        self._check_csrf(session, form)
        target = local_url(request, _text(form.get("next")), f"{base}/")
        token = _text(form.get("token")).strip()
        if not web.tokens:
            return web.redirect(request, target)
        scopes = web.tokens.scopes(token) if token else None
        if scopes is None:
            assert session is not None
            return web.page(
                request,
                "login.html",
                {"title": "Log in", "next": target, "error": "That token is not valid."},
                csrf=web.signer.csrf(session),
                status=401,
            )
        _new, cookie = web.signer.issue(
            token_id(token.encode()), time.time(), web.settings.session_hours
        )
        response = web.redirect(request, target)
        web.set_session(request, response, cookie)
        return response

    async def logout(self, request: Request) -> Response:
        web = self.web
        form = await request.form(max_files=0, max_fields=10)
        session = web.signer.read(request.cookies.get(COOKIE), time.time())
        if session is not None:  # else there is nothing to log out of
            self._check_csrf(session, form)
        base = base_path(request)
        response = web.redirect(request, f"{base}/login" if web.tokens else f"{base}/")
        web.clear_session(request, response)
        return response

    # ------------------------------------------------------------------ overview

    async def overview(self, request: Request) -> Response:
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        ov = await monitor.overview(self.tq.aio)
        points = await monitor.series(self.tq.aio, CHART_HOURS)
        now_ms = int(ov["now_ms"])
        per_minute = [
            (p.at_ms, {k: n * 60_000 / p.interval_ms for k, n in p.counts.items()})
            for p in points
            if p.interval_ms > 0
        ]
        waiting = [(p.at_ms, {k: float(n) for k, n in p.pending.items()}) for p in points]
        context = {
            "title": "Overview",
            "page_kind": "overview",
            "ov": ov,
            "states": [str(s) for s in State],
            "charts": [
                present.chart(
                    "Operations per minute", per_minute, COUNTED, now_ms=now_ms, hours=CHART_HOURS
                ),
                present.chart(
                    "Operations waiting on recovery",
                    waiting,
                    GAUGED,
                    now_ms=now_ms,
                    hours=CHART_HOURS,
                ),
            ],
            "hours": CHART_HOURS,
        }
        template = "overview_live.html" if live else "overview.html"
        return self.web.page(request, template, context, visitor=visitor)

    # ------------------------------------------------------------------ lists

    async def operations(self, request: Request) -> Response:
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        q = request.query_params
        state_text = q.get("state") or str(State.WAITING_RETRY)
        filters = {k: q.get(k, "").strip() for k in ("tool", "code", "ref", "older_than")}
        limit_text = q.get("limit") or "50"
        cursor = q.get("cursor") or None
        problems: dict[str, str] = {}
        try:
            state = State(state_text)
        except ValueError:
            state = State.WAITING_RETRY
            problems["state"] = "not a state"
        try:
            older = present.parse_age(filters["older_than"])
        except ValueError as exc:
            older = None
            problems["older_than"] = str(exc)
        limit = int(limit_text) if limit_text.isdigit() and 0 < int(limit_text) <= 500 else 0
        if not limit:
            problems["limit"] = "a whole number from 1 to 500"
        page = None
        if not problems:
            try:
                page = await self.tq.aio.list_operations(
                    state,
                    tool=filters["tool"] or None,
                    code=filters["code"] or None,
                    ref_contains=filters["ref"] or None,
                    older_than_s=older,
                    cursor=cursor,
                    limit=limit,
                )
            except errors.InvalidArguments as exc:
                problems = _list_problems(exc)
        base = base_path(request)
        here = with_query(
            f"{base}/operations", state=str(state), **filters, limit=limit_text, cursor=cursor
        )
        context = {
            "title": f"{state}",
            "page_kind": "list",
            "state": str(state),
            "states": [str(s) for s in present.LIST_STATES],
            "filters": filters,
            "limit": limit_text,
            "page_sizes": PAGE_SIZES,
            "cursor": cursor or "",
            "page": page,
            "problems": problems,
            "here": here,
            "first_page": with_query(
                f"{base}/operations", state=str(state), **filters, limit=limit_text
            ),
            "next_page": (
                with_query(
                    f"{base}/operations",
                    state=str(state),
                    **filters,
                    limit=limit_text,
                    cursor=page.next_cursor,
                )
                if page is not None and page.next_cursor
                else None
            ),
            "live_url": with_query(
                f"{base}/operations/live",
                state=str(state),
                **filters,
                limit=limit_text,
                cursor=cursor,
            ),
            "bulk_actions": [a for a in actions_for(state, bulk=True) if visitor.may(a.scope)],
            "bulk_refused": [a for a in actions_for(state, bulk=True) if not visitor.may(a.scope)],
            "tools": sorted(t.name for t in self.tq.registry),
        }
        template = "operations_live.html" if live else "operations.html"
        return self.web.page(
            request,
            template,
            context,
            visitor=visitor,
            status=422 if problems and not live else 200,
        )

    # ------------------------------------------------------------------ one operation

    async def operation(
        self,
        request: Request,
        *,
        input_errors: dict[str, str] | None = None,
        input_values: dict[str, str] | None = None,
        message: str = "",
        status: int = 200,
        visitor: Visitor | None = None,
    ) -> Response:
        visitor = visitor or self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        ref = (
            request.query_params.get("ref", "")
            if input_values is None
            else input_values.get("ref", "")
        )
        rec = await self.tq.aio.get(ref) if 0 < len(ref) <= self.max_ref else None
        if rec is None:
            raise Refusal(404, "Not found", "There is no operation with that ref.")
        schema = self._schema(rec.tool)
        detail = present.operation_page(rec, schema)
        fields = None
        if rec.state is State.NEEDS_INPUT and schema is not None:
            fields = forms.form_fields(schema, rec.args)
            if input_values is not None:
                fields = [_refilled(f, input_values) for f in fields]
        context = {
            "title": rec.operation_ref,
            "op": detail,
            "rec": rec,
            "actions": actions_for(rec.state),
            "fields": fields,
            "input_errors": input_errors or {},
            "input_message": message,
            "tool_known": schema is not None,
            "events_url": with_query(f"{base_path(request)}/events", ref=rec.operation_ref),
            "live_url": with_query(f"{base_path(request)}/operation/live", ref=rec.operation_ref),
        }
        template = "operation_live.html" if live else "operation.html"
        return self.web.page(request, template, context, visitor=visitor, status=status)

    def _schema(self, tool: str) -> dict[str, Any] | None:
        try:
            return self.tq.registry.get(tool).input_schema()  # type: ignore[no-any-return]
        except errors.UnknownTool:
            return None

    async def events(self, request: Request) -> Response:
        """The API's event stream for one operation, for this session (EventSource sends
        cookies, not bearer tokens). ``after`` is the first connection's Last-Event-ID."""
        self.web.visitor(request, "read")
        last = request.headers.get("last-event-id") or request.query_params.get("after")
        try:
            return await open_stream(
                self.tq.aio,
                request.query_params.get("ref", ""),
                last,
                keepalive=self.api.keepalive,
                poll=self.api.poll_interval,
                max_ref=self.max_ref,
            )
        except errors.OperationNotFound:
            return PlainTextResponse("no such operation", status_code=404)
        except ApiError as exc:
            return PlainTextResponse(exc.message, status_code=exc.status)

    # ------------------------------------------------------------------ actions

    async def act(self, request: Request) -> Response:
        action = ACTIONS.get(request.path_params.get("action", ""))
        if action is None:
            raise Refusal(404, "Not found", "There is no such action.")
        visitor, form = await self._form_visitor(request, action.scope)
        ref = _text(form.get("ref"))
        back = with_query(f"{base_path(request)}/operation", ref=ref)
        try:
            state = await self._do(action, ref, visitor.actor)
        except errors.RequestRefused as exc:
            if isinstance(exc, errors.ServerUnavailable):
                raise
            message = f"Could not {action.label.lower()}: {_refusal_text(exc)}"
            if wants_json(request):
                return json_answer(False, message, _REFUSAL_STATUS.get(type(exc), 409))
            return self.web.redirect(request, back, [("error", message)])
        message = f"{ref}: {action.done} (now {state})."
        if wants_json(request):
            return json_answer(True, message, state=str(state))
        return self.web.redirect(request, back, [("ok", message)])

    async def _do(self, action: Action, ref: str, by: str) -> Any:
        aio = self.tq.aio
        if action.name == "approve":
            return await aio.approve(ref, by=by)
        if action.name == "cancel":
            return await aio.cancel(ref, by=by)
        if action.name == "retry":
            return await aio.retry_now(ref, by=by)
        return await aio.verify_now(ref, by=by)

    async def bulk(self, request: Request) -> Response:
        visitor, form = await self._form_visitor(request, None)
        action = ACTIONS.get(_text(form.get("action")))
        base = base_path(request)
        back = local_url(request, _text(form.get("back")), f"{base}/operations")
        if action is None or not action.bulk:
            return self.web.redirect(request, back, [("error", "Choose an action.")])
        if not visitor.may(action.scope):
            raise Refusal(403, "Not allowed", f"Your token does not have the {action.scope} scope.")
        refs = list(dict.fromkeys(_text(r) for r in form.getlist("ref") if _text(r)))[:MAX_BULK]
        if not refs:
            return self.web.redirect(request, back, [("error", "Select at least one operation.")])
        done: list[str] = []
        refused: list[str] = []
        for ref in refs:
            try:
                await self._do(action, ref, visitor.actor)
                done.append(ref)
            except errors.RequestRefused as exc:
                if isinstance(exc, errors.ServerUnavailable):
                    raise
                refused.append(f"{ref}: {_refusal_text(exc)}")
        flash = []
        if done:
            flash.append(("ok", f"{action.label}: {len(done)} of {len(refs)} {action.done}."))
        for line in refused[:10]:
            flash.append(("error", f"{action.label} refused for {line}"))
        if len(refused) > 10:
            flash.append(("error", f"… and {len(refused) - 10} more refused."))
        return self.web.redirect(request, back, flash)

    async def provide_input(self, request: Request) -> Response:
        visitor, form = await self._form_visitor(request, "input")
        ref = _text(form.get("ref"))
        rec = await self.tq.aio.get(ref) if 0 < len(ref) <= self.max_ref else None
        if rec is None:
            raise Refusal(404, "Not found", "There is no operation with that ref.")
        back = with_query(f"{base_path(request)}/operation", ref=ref)
        schema = self._schema(rec.tool)
        if schema is None:
            raise Refusal(
                409, "Unknown tool", "This API process does not know the operation's tool."
            )
        values = {k: _text(v) for k, v in form.multi_items()}
        fields = forms.form_fields(schema, rec.args)
        args, problems = forms.parse_form(fields, values, rec.args)
        message = "Some fields need fixing." if problems else ""
        if not problems:
            try:
                await self.tq.aio.provide_input(ref, args, by=visitor.actor)
            except errors.InvalidArguments as exc:
                problems, message = _field_problems(exc, {f.name for f in fields})
            except errors.RequestRefused as exc:
                if isinstance(exc, errors.ServerUnavailable):
                    raise
                return self.web.redirect(request, back, [("error", _refusal_text(exc))])
            else:
                return self.web.redirect(request, back, [("ok", f"{ref}: new arguments queued.")])
        return await self.operation(
            request,
            input_errors=problems,
            input_values=values,
            message=message,
            status=422,
            visitor=visitor,
        )


# --------------------------------------------------------------------------- helpers

_REFUSAL_STATUS: dict[type[errors.RequestRefused], int] = {
    errors.OperationNotFound: 404,
    errors.InvalidArguments: 422,
    errors.InvalidState: 409,
}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _refusal_text(exc: errors.RequestRefused) -> str:
    hint = exc.details.get("code_hint")
    code = hint if isinstance(hint, str) else exc.code
    return f"{scrub(exc.message)[:200]} ({code})"


def _list_problems(exc: errors.InvalidArguments) -> dict[str, str]:
    names = {"ref_contains": "ref", "older_than": "older_than"}
    out: dict[str, str] = {}
    for fe in exc.field_errors:
        out[names.get(fe.field, fe.field)] = scrub(fe.rule)[:200]
    return out or {"filters": scrub(exc.message)[:200]}


def _field_problems(exc: errors.InvalidArguments, names: set[str]) -> tuple[dict[str, str], str]:
    """The tool's validation errors by form field; the rest in one message."""
    hint = exc.details.get("code_hint")
    problems: dict[str, str] = {}
    other: list[str] = []
    for fe in exc.field_errors:
        top = fe.field.split(".")[0]
        text = fe.rule.replace("_", " ")
        if top in names:
            where = fe.field[len(top) + 1 :]
            problems[top] = f"{where}: {text}" if where else text
        else:
            other.append(f"{fe.field}: {text}")
    if hint == "ARGUMENTS_UNCHANGED":
        return problems, "These are the arguments that needed fixing: change at least one."
    if other:
        return problems, "; ".join(other)
    return problems, "Some fields need fixing: see below." if problems else scrub(exc.message)[:200]


def _refilled(f: forms.FormField, values: dict[str, str]) -> forms.FormField:
    """``f`` showing what was posted (never a secret: a secret field stays empty)."""
    from dataclasses import replace

    if f.kind == "secret" or f.keeps_current:
        return f
    return replace(f, value=values.get(f.input_name, ""))
