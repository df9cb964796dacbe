"""ASGI plumbing the middlewares share (token check, host guard, body guard); no FastAPI."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

#: A refusal: the HTTP status and the JSON body.
Refusal = tuple[int, dict[str, str]]


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    raw = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*head, *headers]})
    await send({"type": "http.response.body", "body": raw})


class Guard:
    """A middleware that refuses a request by its scope alone, before ``app`` sees it
    (the host guard, the size guard): a refused HTTP request gets :meth:`refusal`'s
    answer, a refused websocket is closed with :attr:`ws_close_code`."""

    app: ASGIApp
    ws_close_code = 1008  # policy violation
    #: Extra headers on a refused HTTP answer.
    refused_headers: tuple[tuple[bytes, bytes], ...] = ()

    def refusal(self, scope: Scope) -> Refusal | None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            refused = self.refusal(scope)
            if refused is not None:
                if scope["type"] == "websocket":
                    await receive()  # websocket.connect
                    await send({"type": "websocket.close", "code": self.ws_close_code})
                    return
                status, body = refused
                await send_json(send, status, body, self.refused_headers)
                return
        await self.app(scope, receive, send)
