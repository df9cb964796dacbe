"""Which Host and Origin headers the API and the MCP server answer (toolq.edges.api.hosts), as a
table."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolq.edges.api.hosts import HostGuard, allowed_hosts, wildcard_note

LOCAL = allowed_hosts("127.0.0.1")
NAMED = allowed_hosts("0.0.0.0", ["api", "toolq.internal", "fd00::5"])


@pytest.mark.parametrize(
    ("allowed", "host", "origin", "status"),
    [
        # loopback, any port, any spelling of the same address
        (LOCAL, "127.0.0.1:8000", None, None),
        (LOCAL, "localhost", None, None),
        (LOCAL, "LocalHost.:8000", None, None),
        (LOCAL, "[::1]:8000", None, None),
        (LOCAL, "[0:0::1]", None, None),
        (LOCAL, "localhost:8000", "http://localhost:8000", None),
        (LOCAL, "localhost:8000", "https://127.0.0.1:3000", None),
        # a rebound name, or one that merely starts like an allowed one
        (LOCAL, "evil.example", None, 421),
        (LOCAL, "localhost.evil.example:8000", None, 421),
        (LOCAL, "127.0.0.1.nip.io", None, 421),
        (LOCAL, "127.0.0.1:8000:1", None, 421),
        (LOCAL, "127.0.0.1:http", None, 421),
        (LOCAL, "[::1", None, 421),
        (LOCAL, "", None, 421),
        (LOCAL, None, None, 421),
        # cross-origin browser requests
        (LOCAL, "127.0.0.1:8000", "http://evil.example", 403),
        (LOCAL, "127.0.0.1:8000", "null", 403),
        (LOCAL, "127.0.0.1:8000", "file://", 403),
        (LOCAL, "127.0.0.1:8000", "http://user@localhost", 403),
        # bound to every address: loopback and the listed names only
        (NAMED, "api:8080", None, None),
        (NAMED, "TOOLQ.INTERNAL", "https://toolq.internal", None),
        (NAMED, "[fd00::5]:8080", None, None),
        (NAMED, "0.0.0.0:8080", None, 421),
        (NAMED, "10.0.0.7:8080", None, 421),
        (NAMED, "api:8080", "http://evil.example", 403),
    ],
)
def test_host_and_origin_table(
    allowed: frozenset[str], host: str | None, origin: str | None, status: int | None
) -> None:
    headers = [] if host is None else [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    refusal = HostGuard(_never_called, allowed).refusal({"type": "http", "headers": headers})
    assert (refusal[0] if refusal else None) == status


def test_the_bind_address_is_allowed_unless_it_is_a_wildcard() -> None:
    assert "10.0.0.5" in allowed_hosts("10.0.0.5")
    assert "fd00::1" in allowed_hosts("fd00::1") and "fd00::1" in allowed_hosts("[fd00::1]")
    for wildcard in ("0.0.0.0", "::", "[::]"):
        assert allowed_hosts(wildcard) == {"localhost", "127.0.0.1", "::1"}
    with pytest.raises(ValueError, match="'evil example' is not a host"):
        allowed_hosts(None, ["evil example"])


def test_bound_to_every_address_with_no_names_says_what_it_answers() -> None:
    note = wildcard_note("0.0.0.0", [])
    assert note is not None and "TOOLQ_API_ALLOWED_HOSTS" in note
    assert wildcard_note("0.0.0.0", ["api"]) is None
    assert wildcard_note("127.0.0.1", []) is None


def test_a_refusal_is_a_typed_json_body_and_the_app_is_not_called() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "POST", "headers": [(b"host", b"evil.example")]}
    anyio.run(HostGuard(_never_called, LOCAL), scope, receive, send)
    assert sent[0]["status"] == 421
    assert b'"code": "HOST_NOT_ALLOWED"' in sent[1]["body"]

    sent.clear()
    ws = {"type": "websocket", "headers": [(b"host", b"evil.example")]}
    anyio.run(HostGuard(_never_called, LOCAL), ws, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]


async def _never_called(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the guarded app was called")
