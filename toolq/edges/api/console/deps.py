"""The console's dependency keys: every key (``/ui/deps``), one key (``/ui/deps/KEY``),
each with its live part, and an operator lifting a key's pause or closing its breaker
(``POST /ui/actions/deps``, the ``resolve`` scope, as settling an escalated write)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from toolq.core import errors
from toolq.core.redact import scrub
from toolq.decisions.dep_actions import MAX_REASON, DepAction
from toolq.edges.api.console.web import Refusal, Web, base_path, form_text, json_answer, wants_json
from toolq.edges.deps_text import BREAKER_WORDS, limit_text

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

#: The scope an operator's action on a key needs.
SCOPE = "resolve"
#: Each action's button and what it does.
ACTIONS = {
    DepAction.LIFT: ("Lift pause", "End the shared backoff now; the calls it holds back go now."),
    DepAction.CLOSE: (
        "Close breaker",
        "The provider is back: forget the failures; the calls it holds back go now.",
    ),
}


class DepPages:
    """The dependency pages and the action over ``tq``."""

    def __init__(self, tq: ToolQueue, web: Web) -> None:
        self.tq = tq
        self.web = web

    async def deps(self, request: Request) -> Response:
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        context = {
            "title": "Dependencies",
            "page_kind": "deps",
            "deps": await self.tq.aio.deps.list(),
            "limit_text": limit_text,
            "breaker_words": BREAKER_WORDS,
        }
        template = "deps_live.html" if live else "deps.html"
        return self.web.page(request, template, context, visitor=visitor)

    async def dep(self, request: Request) -> Response:
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        key = request.path_params["key"]
        try:
            dep = await self.tq.aio.deps.show(key)
        except (errors.UnknownDependency, errors.InvalidDependencyKey):
            raise Refusal(404, "Not found", "There is no dependency key by that name.") from None
        context = {
            "title": key,
            "page_kind": "deps",
            "dep": dep,
            "limit_text": limit_text,
            "breaker_words": BREAKER_WORDS,
            "actions": [(a.value, *ACTIONS[a]) for a in DepAction],
            "may_act": visitor.may(SCOPE),
            "max_reason": MAX_REASON,
            "live_url": f"{base_path(request)}/deps/{quote(key, safe='')}/live",
        }
        template = "dep_live.html" if live else "dep.html"
        return self.web.page(request, template, context, visitor=visitor)

    async def act(self, request: Request) -> Response:
        """Lift a key's pause or close its breaker, with a reason, as this visitor."""
        visitor, form = await self.web.form_visitor(request, SCOPE, 10)
        key = form_text(form.get("key"))
        action = form_text(form.get("action"))
        back = f"{base_path(request)}/deps/{quote(key, safe='')}"
        label = dict((a.value, ACTIONS[a][0]) for a in DepAction).get(action, "Act")
        try:
            if action == DepAction.LIFT:
                done = await self.tq.aio.deps.lift(
                    key, reason=form_text(form.get("reason")), by=visitor.actor
                )
            elif action == DepAction.CLOSE:
                done = await self.tq.aio.deps.close(
                    key, reason=form_text(form.get("reason")), by=visitor.actor
                )
            else:
                raise errors.InvalidArguments(f"no action {action!r}: lift or close")
        except errors.RequestRefused as exc:
            if isinstance(exc, errors.ServerUnavailable):
                raise
            message = f"Could not {label.lower()}: {scrub(exc.message)[:200]} ({exc.code})"
            status = (
                404
                if isinstance(exc, errors.UnknownDependency)
                else (422 if isinstance(exc, errors.InvalidArguments) else 409)
            )
            if wants_json(request):
                return json_answer(False, message, status)
            return self.web.redirect(request, back, [("error", message)])
        message = (
            f"{key}: {label.lower()} by {visitor.actor}; {done.made_due} waiting calls due now."
        )
        if wants_json(request):
            return json_answer(True, message)
        return self.web.redirect(request, back, [("ok", message)])
