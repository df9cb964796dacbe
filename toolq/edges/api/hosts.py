"""DNS rebinding and cross-origin refusals: answer only for the hosts we were bound for.

A web page can rebind its own name to 127.0.0.1 and call a local, token-less
API from the developer's browser: the request is same-origin to the browser,
so CORS never applies, but its ``Host`` header still names the page's domain.
:class:`HostGuard` answers only requests whose ``Host`` is allowed, and
refuses browser requests from another origin:

- ``Host`` must name ``localhost``, ``127.0.0.1``, ``[::1]``, the address the
  server is bound to when it is a specific one (not ``0.0.0.0`` or ``::``), or
  a name in ``TOOLQ_API_ALLOWED_HOSTS``; any port. Else 421
  ``HOST_NOT_ALLOWED``. Bound to a wildcard address, list the names clients
  use (``api``, ``toolq.internal``); requests to a bare IP other than loopback
  are refused unless it is listed too.
- An ``Origin`` header (sent by browsers on cross-origin requests and on every
  POST) must name an allowed host, on any port; ``Origin: null`` never does.
  Else 403 ``ORIGIN_NOT_ALLOWED``, for every method.

Shared by the HTTP API and the MCP server's HTTP transport; needs no FastAPI.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from toolq.edges.api.asgi import Guard, Refusal

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Scope

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})

HOST_REFUSED = {
    "code": "HOST_NOT_ALLOWED",
    "message": "this server does not answer for the host in the Host header "
    "(allowed: loopback and TOOLQ_API_ALLOWED_HOSTS)",
}
ORIGIN_REFUSED = {
    "code": "ORIGIN_NOT_ALLOWED",
    "message": "cross-origin requests are refused: the Origin is not an allowed host",
}


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header (``name[:port]``, ``[v6][:port]``), normalised; or None.

    Names are lowercased without a trailing dot; IPv6 addresses lose their
    brackets and are compressed (``[0:0::1]`` is ``::1``).
    """
    found = host_and_port(value)
    return None if found is None else found[0]


def host_and_port(value: str) -> tuple[str, str] | None:
    """A ``Host`` header's host (as :func:`host_name` has it) and port ("" when none); or None."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[1:end], value[end + 1 :]
        try:
            name = str(ipaddress.IPv6Address(name)) if end > 0 else ""
        except ValueError:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    name = name.removesuffix(".")
    if not name or not all(c.isascii() and (c.isalnum() or c in "-._:") for c in name):
        return None
    return name, rest[1:]


def origin_netloc(origin: str) -> str | None:
    """The ``host[:port]`` of an ``Origin`` header (``scheme://host[:port]``); None for
    ``null`` or junk."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
        return None
    return parts.netloc


def origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``scheme://host[:port]``); None for ``null`` or junk."""
    netloc = origin_netloc(origin)
    return None if netloc is None else host_name(netloc)


def _configured(raw: str) -> str | None:
    # A listed name or a bind address: a bare IPv6 address is accepted unbracketed.
    value = raw.strip()
    try:
        return str(ipaddress.IPv6Address(value.strip("[]")))
    except ValueError:
        return host_name(value)


def allowed_hosts(bind_host: str | None = None, names: Iterable[str] = ()) -> frozenset[str]:
    """Loopback, ``bind_host`` unless it is a wildcard, and ``names`` (normalised).

    ``ValueError`` for a name that is not a host.
    """
    allowed = set(LOOPBACK)
    for raw in names:
        name = _configured(raw)
        if name is None:
            raise ValueError(f"allowed host {raw.strip()[:80]!r} is not a host name or address")
        allowed.add(name)
    if bind_host is not None and bind_host.strip().strip("[]") not in WILDCARDS:
        name = _configured(bind_host)
        if name is not None:
            allowed.add(name)
    return frozenset(allowed)


def wildcard_note(bind_host: str, names: Iterable[str], what: str = "api") -> str | None:
    """What to say when bound to every address with no names listed, else None."""
    if bind_host.strip().strip("[]") not in WILDCARDS or any(True for _ in names):
        return None
    return (
        f"toolq {what}: bound to {bind_host}, it answers only requests addressed to localhost, "
        "127.0.0.1 or [::1]; list the names clients use in TOOLQ_API_ALLOWED_HOSTS"
    )


class HostGuard(Guard):
    """Refuses a foreign ``Host`` (421) and a foreign ``Origin`` (403) before ``app`` sees them."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app, self.allowed = app, allowed

    def refusal(self, scope: Scope) -> Refusal | None:
        host: str | None = None
        origin: str | None = None
        for key, value in scope.get("headers", ()):
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        if host is None or host_name(host) not in self.allowed:
            return 421, HOST_REFUSED
        if origin is not None and origin_host(origin) not in self.allowed:
            return 403, ORIGIN_REFUSED
        return None
