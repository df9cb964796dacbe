"""The console's routes: a Starlette app mounted at ``/ui``, the guard every handler
runs in (refusals and failures as pages, or JSON for the page's script), logging in
and out, and the event stream. The pages are :mod:`toolq.edges.api.console.pages`, the
actions :mod:`toolq.edges.api.console.actions`; :mod:`toolq.edges.api.console` lists the routes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from toolq.core import errors
from toolq.edges.api.auth import ApiSettings, Tokens, token_id
from toolq.edges.api.console.actions import Actions
from toolq.edges.api.console.deps import DepPages
from toolq.edges.api.console.pages import Pages
from toolq.edges.api.console.session import (
    COOKIE,
    ConsoleSettings,
    Signer,
    cross_site_refusal,
    signing_key,
)
from toolq.edges.api.console.web import (
    STATIC,
    NeedsLogin,
    Refusal,
    SecurityHeaders,
    Visitor,
    Web,
    base_path,
    form_text,
    json_answer,
    local_url,
    wants_json,
    with_query,
)
from toolq.edges.api.events import open_stream
from toolq.edges.api.guard import ApiError, server_failed, server_watch

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue
    from toolq.process.waiting import Watch

log = logging.getLogger("toolq.console")


class Console:
    """One console over ``tq``: its :meth:`app` is mounted at ``/ui``."""

    def __init__(
        self,
        tq: ToolQueue,
        api: ApiSettings,
        tokens: Tokens,
        settings: ConsoleSettings | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.tq = tq
        #: The queue server's outages, said once (shared with the API's routes).
        self.watch = watch or server_watch(lambda: tq.aio.ping())
        self.api = api
        self.settings = settings or ConsoleSettings()
        secret = self.settings.session_secret
        signer = Signer(signing_key(tokens, secret.get_secret_value() if secret else None))
        self.web = Web(tokens, self.settings, signer)
        self.max_ref = tq.settings.limits.max_ref_length
        self.pages = Pages(tq, self.web)
        self.actions = Actions(tq, self.web, self.pages)
        self.deps = DepPages(tq, self.web)

    def app(self) -> Starlette:
        g = self._guarded
        pages, actions, deps = self.pages, self.actions, self.deps
        routes = [
            Route("/", g(pages.overview)),
            Route("/overview/live", g(pages.overview, live=True)),
            Route("/operations", g(pages.operations)),
            Route("/operations/live", g(pages.operations, live=True)),
            Route("/operation", g(pages.operation)),
            Route("/operation/live", g(pages.operation, live=True)),
            Route("/tools/{name}", g(pages.tool)),
            Route("/tools/{name}/live", g(pages.tool, live=True)),
            Route("/events", g(self.events, live=True)),
            Route("/login", g(self.login_form), methods=["GET"]),
            Route("/login", g(self.login, unsafe=True), methods=["POST"]),
            Route("/logout", g(self.logout, unsafe=True), methods=["POST"]),
            Route("/actions/input", g(actions.provide_input, unsafe=True), methods=["POST"]),
            Route("/actions/bulk", g(actions.bulk, unsafe=True), methods=["POST"]),
            Route("/actions/resolve", g(actions.resolve, unsafe=True), methods=["POST"]),
            Route("/deps", g(deps.deps)),
            Route("/deps/live", g(deps.deps, live=True)),
            Route("/deps/{key}", g(deps.dep)),
            Route("/deps/{key}/live", g(deps.dep, live=True)),
            Route("/actions/deps", g(deps.act, unsafe=True), methods=["POST"]),
            Route("/actions/{action}", g(actions.act, unsafe=True), methods=["POST"]),
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
                server_failed(self.watch, exc)
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
            page = self._error(request, 405, "Not allowed", "That method is not allowed here.")
            page.headers.update(exc.headers or {})  # Allow: a 405 must say what is
            return page
        return self._error(request, exc.status_code, "Error", "The request could not be served.")

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
        web.check_csrf(session, form)
        target = local_url(request, form_text(form.get("next")), f"{base}/")
        token = form_text(form.get("token")).strip()
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
            web.check_csrf(session, form)
        base = base_path(request)
        response = web.redirect(request, f"{base}/login" if web.tokens else f"{base}/")
        web.clear_session(request, response)
        return response

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
                away=lambda exc: server_failed(self.watch, exc),
            )
        except errors.OperationNotFound:
            return PlainTextResponse("no such operation", status_code=404)
        except ApiError as exc:
            return PlainTextResponse(exc.message, status_code=exc.status)
