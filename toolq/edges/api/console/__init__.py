"""The operator's console: server-rendered pages at ``/ui/``, served by the API process.

Pages (all need the ``read`` scope)::

    GET  /ui/                         overview: counts per tool and state, pending recovery
                                      with the oldest age, queues, scheduler, workers, rates
                                      and a chart of the last hours
    GET  /ui/operations?state=S       one state's operations; filters tool, code, ref
                                      (substring), older_than (90s, 5m, 2h, 1d); cursor pages
    GET  /ui/operation?ref=R          one operation: timeline, envelope, not_before countdown,
                                      verification checks, arguments (redacted), actions
    GET  /ui/tools/NAME               one tool: its trust figures over 1 h, 24 h and 7 d
    GET  /ui/deps                     every dependency key: limit, in flight, waiting,
                                      paused until (a countdown), breaker, counters
    GET  /ui/deps/KEY                 one key, operators' actions on it, and the actions
    GET  /ui/events?ref=R             the API's event stream for that page (session auth)
    GET  /ui/login, POST /ui/login, POST /ui/logout

Actions (POST, CSRF-checked; each through ``tq.aio`` with ``by="console:<who>"``)::

    /ui/actions/approve    awaiting_approval -> queued           scope approve
    /ui/actions/retry      waiting_retry -> due now              scope approve
    /ui/actions/verify     verifying -> checked now              scope approve
    /ui/actions/cancel     queued or waiting -> cancelled        scope cancel
    /ui/actions/input      needs_input -> queued (the form)      scope input
    /ui/actions/resolve    escalated -> succeeded, failed or     scope resolve
                           queued (outcome, reason, result...)
    /ui/actions/bulk       approve, retry or cancel many refs    that action's scope
    /ui/actions/deps       lift a key's pause or close its       scope resolve
                           breaker (key, action, reason)

Log in with an API token (``TOOLQ_API_TOKENS``); the session is a signed,
``HttpOnly``, ``SameSite=Strict`` cookie that holds no token
(:mod:`toolq.edges.api.console.session`). Without tokens the console, like the API,
serves loopback only and needs no login (actions are recorded as
``console:local``).

Live without reloading: the operation page follows the event stream (and
fetches the changed parts of the page), the overview and lists fetch their
live part every ``TOOLQ_CONSOLE_REFRESH_SECONDS``. When the server goes away
the page says it is reconnecting and carries on when it is back. Everything
is served from the package (no CDN, no build step), so it works air-gapped.

Needs the ``console`` extra (Jinja2, python-multipart); without it ``/ui/``
says how to install it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import Receive, Scope, Send

    from toolq.client.queue import ToolQueue
    from toolq.edges.api.auth import ApiSettings
    from toolq.process.waiting import Watch

#: Where the console is mounted on the API's app.
PREFIX = "/ui"


def available() -> bool:
    """Whether the ``console`` extra is installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("jinja2", "multipart"))


def install_console(
    app: FastAPI, tq: ToolQueue, settings: ApiSettings, watch: Watch | None = None
) -> None:
    """Mount the console at :data:`PREFIX` on the API's ``app`` (same tokens, same guards)."""
    from starlette.responses import RedirectResponse
    from starlette.routing import Route

    async def to_console(_request: object) -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=308)

    app.router.routes.append(Route(PREFIX, to_console, include_in_schema=False))
    if not available():
        app.mount(PREFIX, _not_installed, name="console")
        return
    from toolq.edges.api.console.routes import Console

    app.mount(PREFIX, Console(tq, settings, app.state.tokens, watch=watch).app(), name="console")


async def _not_installed(scope: Scope, receive: Receive, send: Send) -> None:
    from toolq.edges.api.asgi import send_json

    message = "the console needs the console extra: pip install 'toolq[console]'"
    await send_json(send, 404, {"code": "CONSOLE_NOT_INSTALLED", "message": message})
