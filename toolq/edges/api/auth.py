"""Bearer tokens with scopes, and the loopback-only rule when there are none.

Shared by the HTTP API and the MCP server's HTTP transport; needs no FastAPI.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from toolq.edges.api.asgi import send_json
from toolq.edges.api.hosts import allowed_hosts

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

#: ``resolve`` settles an escalated operation (committed, not committed, retried): a
#: person's word about what happened at the provider, which approving does not imply.
SCOPES = frozenset({"read", "invoke", "approve", "input", "cancel", "resolve"})
MIN_TOKEN_LENGTH = 16


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOOLQ_API_", extra="ignore")

    #: ``TOKEN=scope,scope;TOKEN=scope``. Unset: no authentication, loopback only.
    tokens: SecretStr | None = None
    #: The longest a ``?wait=`` may hold a request (seconds).
    max_wait: float = Field(default=30.0, gt=0, le=300)
    #: What a pending operation tells pollers (``poll_interval``, ``Retry-After``).
    poll_interval: float = Field(default=1.0, gt=0, le=60)
    #: Seconds between keep-alive comments on an event stream (and re-reads of its
    #: history, in case a notice was missed).
    keepalive: float = Field(default=15.0, gt=0, le=300)
    #: Request bodies above this are refused with 413; default: ``limits.max_args_bytes``.
    max_body_bytes: int | None = Field(default=None, ge=64)
    #: A path and query longer than this is refused with 414 before any work. The
    #: routes need a few hundred bytes (a ref is at most 200 characters, a cursor
    #: 1,024); an 8,000-character URL once held the event loop for seconds.
    max_url_bytes: int = Field(default=4096, ge=1024, le=65536)
    #: Headers larger than this in all ("name: value" lines) are refused with 431.
    #: A browser sends every cookie it holds for the host (cookies ignore ports):
    #: raise it if other apps on localhost set large ones.
    max_header_bytes: int = Field(default=8192, ge=1024, le=65536)
    #: Seconds a request (line, headers and body) may take to arrive, from its
    #: connection opening or the previous response on it; else 408 and the connection
    #: is closed. Without it a connection sending half a header was held forever, and
    #: enough of them took every file descriptor: the API answered no one.
    request_timeout: float = Field(default=10.0, gt=0, le=300)
    #: Host names (or addresses) the server answers for besides loopback and its own
    #: specific bind address, any port: ``TOOLQ_API_ALLOWED_HOSTS=api,toolq.internal``.
    #: Every other Host is refused (421), so a rebound DNS name cannot reach it.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            value = tuple(str(v).strip() for v in value if str(v).strip())
            allowed_hosts(None, value)  # ValueError (a validation error) for a bad name
        return value

    def token_table(self) -> Tokens:
        return Tokens.parse(self.tokens.get_secret_value() if self.tokens else None)


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens and their scopes. Empty means no authentication."""

    entries: tuple[tuple[bytes, frozenset[str]], ...] = ()

    @classmethod
    def parse(cls, spec: str | None) -> Tokens:
        """Parse ``TOKEN=scope,scope;...``; errors never quote a token."""
        entries: list[tuple[bytes, frozenset[str]]] = []
        for number, raw in enumerate((spec or "").split(";"), 1):
            part = raw.strip()
            if not part:
                continue
            token, sep, scope_list = part.rpartition("=")
            token = token.strip()
            if not sep or not token:
                raise ValueError(f"API token entry {number} must look like TOKEN=scope,scope")
            if len(token) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"API token entry {number} is shorter than {MIN_TOKEN_LENGTH} characters"
                )
            scopes = {s.strip() for s in scope_list.split(",") if s.strip()}
            unknown = scopes - SCOPES - {"*"}
            if unknown or not scopes:
                raise ValueError(
                    f"API token entry {number}: unknown or missing scopes {sorted(unknown)}; "
                    f"use {', '.join(sorted(SCOPES))} or *"
                )
            entries.append((token.encode(), SCOPES if "*" in scopes else frozenset(scopes)))
        return cls(tuple(entries))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def scopes(self, presented: str) -> frozenset[str] | None:
        """The presented token's scopes; every entry is compared, each in constant time."""
        given = presented.encode()
        found: frozenset[str] | None = None
        for token, scopes in self.entries:
            if hmac.compare_digest(token, given):
                found = scopes
        return found

    def check(self, authorization: str | None, scope: str) -> tuple[int, str, str] | None:
        """``None`` if ``authorization`` (the header) may use ``scope``; else (status, code,
        message) of the refusal. Without tokens everything is allowed."""
        if not self:
            return None
        kind, _sep, value = (authorization or "").partition(" ")
        if kind.lower() != "bearer" or not value.strip():
            return 401, "UNAUTHENTICATED", "a bearer token is required"
        scopes = self.scopes(value.strip())
        if scopes is None:
            return 401, "UNAUTHENTICATED", "the bearer token is not valid"
        if scope not in scopes:
            return 403, "FORBIDDEN_SCOPE", f"this token does not have the {scope} scope"
        return None


def token_id(token: bytes) -> str:
    """A token's public fingerprint: names its sessions and actions, reveals nothing of it.

    (The prefix is the console's, where it was first used: changing it would rename
    every operator in the histories already written.)
    """
    return hashlib.sha256(b"toolq-console-token:" + token).hexdigest()[:16]


def actor_of(tokens: Tokens, authorization: str | None, interface: str) -> str:
    """Who the history says acted, for a request its token was checked for:
    ``<interface>:token-<first 8 hex of token_id>``, or ``<interface>:local`` without tokens."""
    if not tokens:
        return f"{interface}:local"
    _kind, _sep, value = (authorization or "").partition(" ")
    return f"{interface}:token-{token_id(value.strip().encode())[:8]}"


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_refusal(host: str, tokens: Tokens, what: str = "api") -> str | None:
    """Why ``host`` may not be bound (no tokens and not loopback), or ``None``."""
    if tokens or is_loopback(host):
        return None
    return (
        f"no API tokens are configured (TOOLQ_API_TOKENS): toolq {what} serves loopback "
        f"only without them; refusing --host {host}"
    )


def check_bind(host: str, tokens: Tokens, what: str = "api") -> None:
    """Refuse a non-loopback host without tokens; say so when serving without them."""
    refusal = bind_refusal(host, tokens, what)
    if refusal is not None:
        raise ValueError(refusal)
    if tokens:
        return
    print(
        f"toolq {what}: no tokens configured (TOOLQ_API_TOKENS), so no authentication; "
        f"serving on loopback only ({host})",
        file=sys.stderr,
    )


class RequireScope:
    """Bearer-token check in front of another ASGI app (the MCP HTTP transport).

    Every HTTP request needs ``scope``; the token's scopes are left in the
    ASGI scope under ``"toolq.scopes"`` for finer checks behind it.
    """

    def __init__(self, app: ASGIApp, tokens: Tokens, scope: str) -> None:
        self.app, self.tokens, self.scope = app, tokens, scope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers", ()))
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            refusal = self.tokens.check(authorization, self.scope)
            if refusal is not None:
                status, code, message = refusal
                extra = ((b"www-authenticate", b"Bearer"),) if status == 401 else ()
                await send_json(send, status, {"code": code, "message": message}, extra)
                return
            _kind, _sep, token = authorization.partition(" ")
            scope["toolq.scopes"] = self.tokens.scopes(token.strip())
        await self.app(scope, receive, send)
