"""The body guard (toolq.edges.api.guard.BodyLimitGuard), driven at the ASGI level."""

from __future__ import annotations

import asyncio
from typing import Any

from toolq.edges.api.guard import BodyLimitGuard

SCOPE = {"type": "http", "method": "POST", "path": "/v1/tools/create_note:invoke", "headers": []}


def serve(
    *messages: dict[str, Any], max_body: int = 1024
) -> tuple[list[bytes], list[dict[str, Any]]]:
    """Run the guard over a client sending ``messages``: the bodies the app read, and
    what was sent back."""
    bodies: list[bytes] = []
    sent: list[dict[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    asyncio.run(BodyLimitGuard(app, max_body)(dict(SCOPE), receive, send))
    return bodies, sent


def test_a_whole_body_reaches_the_app_in_one_piece() -> None:
    bodies, sent = serve(
        {"type": "http.request", "body": b'{"body":', "more_body": True},
        {"type": "http.request", "body": b'"x"}', "more_body": False},
    )
    assert bodies == [b'{"body":"x"}'] and sent[0]["status"] == 202


def test_a_body_cut_short_by_a_disconnect_reaches_no_route() -> None:
    # Given a client that sends part of its body (valid JSON so far), then leaves
    bodies, sent = serve(
        {"type": "http.request", "body": b'{"body":"half"}', "more_body": True},
        {"type": "http.disconnect"},
    )

    # Then nothing acts on it (a write ran with it before), and no one is answered
    assert bodies == [] and sent == []


def test_a_body_over_the_limit_is_a_413() -> None:
    bodies, sent = serve({"type": "http.request", "body": b"x" * 2000}, max_body=1024)
    assert bodies == [] and sent[0]["status"] == 413
