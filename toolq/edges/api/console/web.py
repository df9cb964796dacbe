"""The console's plumbing: who is asking (:class:`Visitor`), pages, cookies, headers."""

from __future__ import annotations

import hashlib
import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolq.core.states import TERMINAL
from toolq.edges.api.auth import Tokens
from toolq.edges.api.console import present
from toolq.edges.api.console.session import (
    COOKIE,
    CSRF_FIELD,
    FLASH_COOKIE,
    ConsoleSettings,
    Session,
    Signer,
    actor,
    scopes_of,
)

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

#: Every console response: nothing loads from elsewhere, no inline script, no framing.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # Refs are in the console's URLs: they stay on this origin.
    (b"referrer-policy", b"same-origin"),
)


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response of the console."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", ())}
                extra = [(n, v) for n, v in SECURITY_HEADERS if n not in names]
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


@dataclass
class Visitor:
    """Who is asking, as far as the console is concerned."""

    session: Session
    scopes: frozenset[str]
    csrf: str
    #: A session cookie to set on the response (a new anonymous session).
    new_cookie: str | None = None

    @property
    def actor(self) -> str:
        return actor(self.session)

    @property
    def name(self) -> str:
        return self.actor.removeprefix("console:")

    def may(self, scope: str) -> bool:
        return scope in self.scopes


class Refusal(Exception):
    """A request the console answers with a page of its own (status, title, message)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(title)
        self.status, self.title, self.message = status, title, message


class NeedsLogin(Exception):
    """No valid session: pages redirect to the login page, fragments answer 401."""


class Web:
    """Sessions, templates and responses for one console."""

    def __init__(self, tokens: Tokens, settings: ConsoleSettings, signer: Signer) -> None:
        self.tokens = tokens
        self.settings = settings
        self.signer = signer
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            auto_reload=False,  # the templates ship with the package: no stat per render
        )
        self.env.filters["duration"] = present.duration
        self.env.filters["refq"] = lambda ref: quote(str(ref), safe="")
        self.env.filters["dom_id"] = dom_id
        self.env.globals["state_help"] = {str(k): v for k, v in present.STATE_HELP.items()}
        self.env.globals["CSRF_FIELD"] = CSRF_FIELD
        self.env.globals["clock"] = present.clock_time
        self.env.globals["until"] = present.until
        self.env.globals["recovery_time"] = present.recovery_time
        self.env.globals["covered"] = present.covered
        self.env.globals["terminal_states"] = TERMINAL
        from toolq import __version__

        self.version = __version__

    # ------------------------------------------------------------------ who is asking

    def visitor(self, request: Request, scope: str | None) -> Visitor:
        """The visitor, allowed ``scope``; :class:`NeedsLogin` or :class:`Refusal` if not."""
        now = time.time()
        session = self.signer.read(request.cookies.get(COOKIE), now)
        new_cookie = None
        if not self.tokens:
            # No tokens means no authentication: only this machine may use it.
            if not _loopback_client(request):
                raise Refusal(
                    403, "Not allowed", "Without API tokens the console serves loopback only."
                )
            if session is None:
                session, new_cookie = self.signer.issue("", now, self.settings.session_hours)
        scopes = scopes_of(self.tokens, session)
        if scopes is None or session is None:
            raise NeedsLogin()
        if scope is not None and scope not in scopes:
            raise Refusal(
                403,
                "Not allowed",
                f"Your token does not have the {scope} scope, which this needs.",
            )
        return Visitor(session, scopes, self.signer.csrf(session), new_cookie)

    def anonymous(self, request: Request) -> tuple[Session, str | None]:
        """The browser's session for the login form, made if it has none."""
        now = time.time()
        session = self.signer.read(request.cookies.get(COOKIE), now)
        if session is not None:
            return session, None
        return self.signer.issue("", now, self.settings.session_hours)

    # ------------------------------------------------------------------ forms

    def check_csrf(self, session: Session | None, form: Any) -> None:
        given = form.get(CSRF_FIELD)
        if not self.signer.csrf_ok(session, given if isinstance(given, str) else None):
            raise Refusal(
                403,
                "Refused",
                "Refused: the form is out of date or did not come from this console "
                "(reload the page and try again).",
            )

    async def form_visitor(
        self, request: Request, scope: str | None, max_fields: int
    ) -> tuple[Visitor, Any]:
        """The visitor of a state-changing request and its form, CSRF checked."""
        visitor = self.visitor(request, None)
        form = await request.form(max_files=0, max_fields=max_fields)
        self.check_csrf(visitor.session, form)
        if scope is not None and not visitor.may(scope):
            raise Refusal(403, "Not allowed", f"Your token does not have the {scope} scope.")
        return visitor, form

    # ------------------------------------------------------------------ responses

    def page(
        self,
        request: Request,
        template: str,
        context: dict[str, Any],
        *,
        visitor: Visitor | None = None,
        status: int = 200,
        csrf: str | None = None,
    ) -> HTMLResponse:
        """A page from ``template``: it shows and clears pending flash messages (a live
        fragment, fetched in the background, leaves them for the page they were meant for)."""
        live = template.endswith("_live.html")
        flash = (
            [] if live else self.signer.read_flash(request.cookies.get(FLASH_COOKIE), time.time())
        )
        base = base_path(request)
        html = self.env.get_template(template).render(
            base=base,
            version=self.version,
            visitor=visitor,
            csrf=csrf if csrf is not None else (visitor.csrf if visitor else ""),
            auth=bool(self.tokens),
            flash=flash,
            now_ms=int(time.time() * 1000),
            refresh_ms=int(self.settings.refresh_seconds * 1000),
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=_NO_STORE)
        if visitor is not None and visitor.new_cookie:
            self.set_session(request, response, visitor.new_cookie)
        if visitor is not None:
            response.headers["X-CSRF-Token"] = visitor.csrf
        if flash or (not live and request.cookies.get(FLASH_COOKIE)):
            response.delete_cookie(FLASH_COOKIE, path=base or "/")
        return response

    def redirect(
        self, request: Request, to: str, flash: list[tuple[str, str]] | None = None
    ) -> RedirectResponse:
        response = RedirectResponse(to, status_code=303, headers=_NO_STORE)
        if flash:
            self._cookie(request, response, FLASH_COOKIE, self.signer.flash(flash, time.time()), 60)
        return response

    def set_session(self, request: Request, response: Response, value: str) -> None:
        self._cookie(request, response, COOKIE, value, int(self.settings.session_hours * 3600))

    def clear_session(self, request: Request, response: Response) -> None:
        response.delete_cookie(COOKIE, path=base_path(request) or "/")

    def _cookie(
        self, request: Request, response: Response, name: str, value: str, max_age: int
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=base_path(request) or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )


_NO_STORE = {"Cache-Control": "no-store"}


def form_text(value: Any) -> str:
    """A form field's value as text ("" for a file or nothing)."""
    return value if isinstance(value, str) else ""


def wants_json(request: Request) -> bool:
    """A request from the page's own script (it then reads JSON, not a redirect)."""
    return request.headers.get("x-requested-with") == "fetch"


def json_answer(ok: bool, message: str, status: int = 200, **extra: Any) -> JSONResponse:
    return JSONResponse(
        {"ok": ok, "message": message, **extra}, status_code=status, headers=_NO_STORE
    )


def base_path(request: Request) -> str:
    """Where the console is mounted (``/ui``, or behind a proxy's root path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def dom_id(text: str) -> str:
    """A stable element id for a ref (refs may hold any character)."""
    return "r" + hashlib.sha256(str(text).encode()).hexdigest()[:12]


def local_url(request: Request, target: str | None, default: str) -> str:
    """``target`` if it is a path in this console, else ``default`` (no open redirect)."""
    base = base_path(request)
    if (
        target
        and target.startswith(base + "/")
        and not target.startswith("//")
        and "\\" not in target
        and all(c.isprintable() for c in target)
    ):
        return target
    return default


def with_query(path: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


def _loopback_client(request: Request) -> bool:
    client = request.client
    if client is None:
        return False
    try:
        return ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False
