"""The size guard's refusals, decided from the ASGI scope alone (toolq.edges.api.sizes)."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.edges.api.auth import ApiSettings
from toolq.edges.api.sizes import SizeGuard, parser_buffer

GUARD = SizeGuard(None, max_url=4096, max_headers=8192)  # type: ignore[arg-type]


def scope(path: bytes = b"/v1/health", query: bytes = b"", header: int = 10) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1"), (b"x-pad", b"a" * header)]
    return {"type": "http", "raw_path": path, "query_string": query, "headers": headers}


@pytest.mark.parametrize(
    ("request_scope", "status"),
    [
        (scope(), None),
        (scope(query=b"q=" + b"a" * 4000), None),
        (scope(query=b"q=" + b"a" * 8000), 414),
        (scope(path=b"/v1/operations/" + b"a" * 5000), 414),
        (scope(header=8000), None),
        (scope(header=8 << 10), 431),
        (scope(query=b"a" * 5000, header=9000), 414),
    ],
)
def test_refusal(request_scope: dict[str, Any], status: int | None) -> None:
    refused = GUARD.refusal(request_scope)
    assert (refused[0] if refused else None) == status
    if refused:
        assert refused[1]["code"] in ("URI_TOO_LONG", "HEADERS_TOO_LARGE")


def test_the_parser_holds_a_head_the_guard_may_still_refuse() -> None:
    settings = ApiSettings()
    assert parser_buffer(settings) > settings.max_url_bytes + settings.max_header_bytes
    assert parser_buffer(settings) < 64 << 10
