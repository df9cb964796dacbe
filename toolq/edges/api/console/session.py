"""The console's sessions and its defence against cross-site requests (pure: no I/O).

A session is a signed cookie, not a server-side record. Several API replicas
may serve one console behind a load balancer, and a restarted API must not log
its operators out (the page recovers by itself, :mod:`toolq.edges.api.console`): a
cookie any replica can check with the same key gives both, with no sticky
sessions and no session store. The price is that logging out clears the
cookie in the browser but cannot revoke a copy of it; so a session is short
(:attr:`ConsoleSettings.session_hours`), and it ends on every replica as soon
as its token is removed from ``TOOLQ_API_TOKENS`` (its scopes are read from the
token table on each request, never from the cookie).

The cookie holds no token: ``v1.<payload>.<mac>`` where the payload is
``{"n": nonce, "t": token_id, "e": expiry}``; ``token_id`` is a fingerprint of
the token (:func:`toolq.edges.api.auth.token_id`), which also names the operator in the history
(``console:token-<first 8 hex>``). The key is ``TOOLQ_CONSOLE_SESSION_SECRET``
when set, else derived from every configured token together, so replicas
sharing ``TOOLQ_API_TOKENS`` share it and no one holding only some of the tokens
can sign a cookie. Without tokens (loopback only), a key made at start-up
signs anonymous sessions; after a restart the pages pick up a new CSRF token
from the next response they fetch.

Cross-site requests, three locks, all of which a state-changing request must
pass (:func:`cross_site_refusal`, :meth:`Signer.csrf_ok`):

- the cookie is ``SameSite=Strict`` and ``HttpOnly``: another site's page
  cannot send it, nor a script read it;
- every form carries a CSRF token derived from the session's nonce; a page
  on another port of the same host (same *site*, so it would get the cookie)
  cannot read it;
- a browser's ``Sec-Fetch-Site`` must be ``same-origin`` and its ``Origin``
  must be this server's own (host and port), when sent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolq.edges.api.auth import SCOPES, Tokens, token_id
from toolq.edges.api.hosts import host_and_port, origin_netloc

COOKIE = "toolq_console"
FLASH_COOKIE = "toolq_console_flash"
#: The form field (and ``X-CSRF-Token`` header) carrying the CSRF token.
CSRF_FIELD = "csrf"
_VERSION = "v1"
#: The longest cookie value read at all: anything longer is not one of ours.
_MAX_COOKIE = 1024
#: The longest flash cookie, written or read: what a browser keeps (4,096 bytes with
#: the name), with room. A bulk action's refusals took more than 1,024 from five on,
#: and the next page showed none of its messages.
_MAX_FLASH = 4000


class ConsoleSettings(BaseSettings):
    """``TOOLQ_CONSOLE_*``: the console's sessions and refresh rate."""

    model_config = SettingsConfigDict(env_prefix="TOOLQ_CONSOLE_", extra="ignore")

    #: Signs session cookies; unset: derived from the tokens (replicas sharing
    #: ``TOOLQ_API_TOKENS`` agree). Set it to end every session at once when it changes.
    session_secret: SecretStr | None = None
    #: A session ends this long after its login; short, as a stolen cookie lives as long.
    session_hours: float = Field(default=12.0, gt=0, le=24 * 30)
    #: Seconds between the overview's and the lists' refreshes (each one page fetch).
    refresh_seconds: float = Field(default=3.0, ge=0.5, le=300)


@dataclass(frozen=True)
class Session:
    """One browser's session: a nonce (its CSRF token's seed) and who logged in."""

    nonce: str
    #: :func:`token_id` of the token logged in with; "" for anonymous (before a
    #: login, or without tokens).
    token_id: str
    #: When it ends (unix seconds).
    expires: int

    @property
    def anonymous(self) -> bool:
        return not self.token_id


def actor(session: Session | None) -> str:
    """The ``by`` recorded in the history for an action from this session."""
    if session is None or session.anonymous:
        return "console:local"
    return f"console:token-{session.token_id[:8]}"


def scopes_of(tokens: Tokens, session: Session | None) -> frozenset[str] | None:
    """The session's scopes from the current token table; None if it is not logged in
    with a token that is still configured. Without tokens: every scope."""
    if not tokens:
        return SCOPES
    if session is None or session.anonymous:
        return None
    found: frozenset[str] | None = None
    for token, scopes in tokens.entries:
        if hmac.compare_digest(token_id(token), session.token_id):
            found = scopes
    return found


def signing_key(tokens: Tokens, secret: str | None) -> bytes:
    """The key sessions are signed with (see the module docstring)."""
    if secret:
        return hashlib.sha256(b"toolq-console-secret:" + secret.encode()).digest()
    if tokens:
        mac = hmac.new(b"toolq-console-session-key", digestmod=hashlib.sha256)
        for token in sorted(t for t, _s in tokens.entries):
            mac.update(len(token).to_bytes(4, "big") + token)
        return mac.digest()
    return secrets.token_bytes(32)


class Signer:
    """Issues and reads session cookies, CSRF tokens and flash messages with one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, purpose: bytes, data: bytes) -> str:
        digest = hmac.new(self._key, purpose + b"\x00" + data, hashlib.sha256).digest()
        return _b64(digest)

    def _seal(self, purpose: bytes, payload: dict[str, Any]) -> str:
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{_VERSION}.{body}.{self._mac(purpose, body.encode())}"

    def _open(
        self, purpose: bytes, value: str | None, longest: int = _MAX_COOKIE
    ) -> dict[str, Any] | None:
        if not value or len(value) > longest:
            return None
        version, _, rest = value.partition(".")
        body, _, mac = rest.partition(".")
        if version != _VERSION or not body or not mac:
            return None
        # As bytes: compare_digest raises TypeError on a str that is not ASCII.
        expected = self._mac(purpose, body.encode()).encode()
        if not hmac.compare_digest(mac.encode(errors="replace"), expected):
            return None
        try:
            data = json.loads(_unb64(body))
        except (ValueError, binascii.Error):
            return None
        return data if isinstance(data, dict) else None

    # ------------------------------------------------------------------ sessions

    def issue(self, token: str, now: float, hours: float) -> tuple[Session, str]:
        """A new session (a fresh nonce: a login never keeps the nonce it came with)."""
        session = Session(secrets.token_urlsafe(18), token, int(now + hours * 3600))
        payload = {"n": session.nonce, "t": session.token_id, "e": session.expires}
        return session, self._seal(b"session", payload)

    def read(self, cookie: str | None, now: float) -> Session | None:
        """The session in ``cookie``; None if absent, forged, malformed or expired."""
        data = self._open(b"session", cookie)
        if data is None:
            return None
        nonce, tid, expires = data.get("n"), data.get("t"), data.get("e")
        if not (isinstance(nonce, str) and isinstance(tid, str) and isinstance(expires, int)):
            return None
        if not nonce or expires <= now:
            return None
        return Session(nonce, tid, expires)

    # ------------------------------------------------------------------ CSRF

    def csrf(self, session: Session) -> str:
        """The CSRF token of ``session``'s forms."""
        return self._mac(b"csrf", session.nonce.encode())

    def csrf_ok(self, session: Session | None, given: str | None) -> bool:
        if session is None or not given or len(given) > 128:
            return False
        return hmac.compare_digest(given.encode(errors="replace"), self.csrf(session).encode())

    # ------------------------------------------------------------------ flash messages

    def flash(self, messages: list[tuple[str, str]], now: float) -> str:
        """A cookie carrying ``(level, text)`` messages to the next page (for a minute):
        the first ones that fit in :data:`_MAX_FLASH`, then how many more there were."""
        kept = [(level, text[:500]) for level, text in messages[:20]]
        more = [level for level, _text in messages[20:]]
        while True:
            shown = [*kept, (more[-1], f"… and {len(more)} more not shown.")] if more else kept
            value = self._seal(b"flash", {"m": [list(m) for m in shown], "e": int(now) + 60})
            if len(value) <= _MAX_FLASH or not kept:
                return value
            more.insert(0, kept.pop()[0])

    def read_flash(self, cookie: str | None, now: float) -> list[tuple[str, str]]:
        data = self._open(b"flash", cookie, _MAX_FLASH)
        if data is None or not isinstance(data.get("e"), int) or data["e"] < now:
            return []
        out: list[tuple[str, str]] = []
        for item in data.get("m") or ():
            if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
                out.append((item[0], item[1][:500]))
        return out


# --------------------------------------------------------------------------- cross-site


def cross_site_refusal(headers: Mapping[str, str], host: str | None) -> str | None:
    """Why a state-changing browser request is refused as cross-site, or None.

    ``headers`` are the request's (lower-case names); ``host`` its ``Host``. A
    request without ``Origin`` and ``Sec-Fetch-Site`` (not a browser, or a very
    old one) passes here: the CSRF token still has to match.
    """
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return f"a request from another page ({site}) cannot change anything here"
    origin = headers.get("origin")
    if origin is not None:
        own = _site(host)
        theirs = _site(origin_netloc(origin))
        if own is None or theirs is None or theirs != own:
            return "the request comes from another origin"
    return None


def _site(netloc: str | None) -> tuple[str, str] | None:
    """``(host, port)`` of a ``Host`` or an ``Origin``'s netloc, without a default port:
    browsers leave the default port out of both, and a TLS proxy in front changes the
    scheme the server sees, so the scheme is not compared."""
    found = host_and_port(netloc) if netloc else None
    if found is None:
        return None
    name, port = found
    port = port.lstrip("0")
    return name, ("" if port in ("80", "443") else port)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
