"""The console's pages: the overview, a state's list of operations, one operation.

Each renders a whole page, or (``/live``) the part of it that the page's script
fetches again.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from toolq.core import errors
from toolq.core.redact import scrub
from toolq.core.states import State
from toolq.edges import monitor
from toolq.edges.api.console import forms, present, resolutions
from toolq.edges.api.console.verbs import actions_for
from toolq.edges.api.console.web import Refusal, Visitor, Web, base_path, with_query
from toolq.services.scheduler.series import COUNTED, GAUGED
from toolq.services.scheduler.trust import WINDOWS

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

PAGE_SIZES = (25, 50, 100, 200)
_LIMIT = re.compile(r"[0-9]{1,3}")
#: The list's ``state`` for every state (what a search shows unless one is asked for).
ALL = "all"
#: Hours the overview's charts cover.
CHART_HOURS = 3.0


class Pages:
    """The read-only pages over ``tq`` (the ``read`` scope)."""

    def __init__(self, tq: ToolQueue, web: Web) -> None:
        self.tq = tq
        self.web = web
        self.max_ref = tq.settings.limits.max_ref_length

    async def overview(self, request: Request) -> Response:
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        ov = await monitor.overview(self.tq.aio)
        points = await monitor.series(self.tq.aio, CHART_HOURS)
        now_ms = int(ov["now_ms"])
        per_minute = [
            (p.at_ms, {k: n * 60_000 / p.interval_ms for k, n in p.counts.items()})
            for p in points
            if p.interval_ms > 0
        ]
        waiting = [(p.at_ms, {k: float(n) for k, n in p.pending.items()}) for p in points]
        context = {
            "title": "Overview",
            "page_kind": "overview",
            "ov": ov,
            "states": [str(s) for s in State],
            "charts": [
                present.chart(
                    "Operations per minute", per_minute, COUNTED, now_ms=now_ms, hours=CHART_HOURS
                ),
                present.chart(
                    "Operations waiting on recovery",
                    waiting,
                    GAUGED,
                    now_ms=now_ms,
                    hours=CHART_HOURS,
                ),
            ],
            "hours": CHART_HOURS,
        }
        window = request.query_params.get("trust", "1h")
        if window not in WINDOWS:
            window = "1h"
        context["trust"] = await monitor.trust(self.tq.aio, window)
        context["trust_windows"] = list(WINDOWS)
        template = "overview_live.html" if live else "overview.html"
        return self.web.page(request, template, context, visitor=visitor)

    async def tool(self, request: Request) -> Response:
        """One tool: its trust figures over every window, its operations per state."""
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        name = request.path_params["name"]
        figures = {w: await monitor.trust(self.tq.aio, w) for w in WINDOWS}
        known = {t.name for t in self.tq.registry} | set(self.tq.app.seen_tools)
        if name not in known and not any(name in f["tools"] for f in figures.values()):
            raise Refusal(404, "Not found", "There is no tool by that name.")
        context = {
            "title": name,
            "page_kind": "tool",
            "tool": name,
            "windows": figures,
            "states": [str(s) for s in State],
            "live_url": f"{base_path(request)}/tools/{quote(name, safe='')}/live",
        }
        template = "tool_live.html" if live else "tool.html"
        return self.web.page(request, template, context, visitor=visitor)

    async def operations(self, request: Request) -> Response:
        visitor = self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        q = request.query_params
        search = q.get("q", "").strip()
        # A search looks in every state unless a state is asked for; a list, in one.
        state_text = q.get("state") or (ALL if search else str(State.WAITING_RETRY))
        filters = {k: q.get(k, "").strip() for k in ("tool", "code", "ref", "older_than")}
        limit_text = q.get("limit") or "50"
        order = "newest" if q.get("order") == "newest" else "oldest"
        cursor = q.get("cursor") or None
        problems: dict[str, str] = {}
        state: State | None = None
        if state_text != ALL:
            try:
                state = State(state_text)
            except ValueError:
                state = State.WAITING_RETRY
                problems["state"] = "not a state"
        try:
            older = present.parse_age(filters["older_than"])
        except ValueError as exc:
            older = None
            problems["older_than"] = str(exc)
        # ASCII digits: str.isdigit() also takes "²", which int() refuses (a 500 once).
        limit = int(limit_text) if _LIMIT.fullmatch(limit_text) else 0
        limit = limit if 0 < limit <= 500 else 0
        if not limit:
            problems["limit"] = "a whole number from 1 to 500"
        page = None
        if not problems:
            try:
                page = await self.tq.aio.list_operations(
                    state,
                    tool=filters["tool"] or None,
                    code=filters["code"] or None,
                    ref_contains=filters["ref"] or None,
                    older_than_s=older,
                    cursor=cursor,
                    limit=limit,
                    newest_first=order == "newest",
                    search=search or None,
                )
            except errors.InvalidArguments as exc:
                problems = list_problems(exc)
        base = base_path(request)
        shown = ALL if state is None else str(state)
        kept = {"state": shown, "q": search, **filters, "limit": limit_text}

        def at(path: str = "/operations", **more: str | None) -> str:
            newest = order if order == "newest" else None
            return with_query(f"{base}{path}", **{**kept, "order": newest, **more})

        context = {
            "title": f"Search: {search}" if search else shown,
            "page_kind": "list",
            "state": shown,
            "search": search,
            "states": [str(s) for s in present.LIST_STATES],
            "filters": filters,
            "limit": limit_text,
            "order": order,
            "page_sizes": PAGE_SIZES,
            "cursor": cursor or "",
            "page": page,
            "problems": problems,
            "here": at(cursor=cursor),
            "first_page": at(),
            "prev_page": at(cursor=page.prev_cursor) if page and page.prev_cursor else None,
            "next_page": at(cursor=page.next_cursor) if page and page.next_cursor else None,
            "flip_order": with_query(
                f"{base}/operations",
                **kept,
                order=None if order == "newest" else "newest",
            ),
            "live_url": at("/operations/live", cursor=cursor),
            "bulk_actions": [a for a in actions_for(state, bulk=True) if visitor.may(a.scope)]
            if state is not None
            else [],
            "bulk_refused": [a for a in actions_for(state, bulk=True) if not visitor.may(a.scope)]
            if state is not None
            else [],
            "tools": sorted(t.name for t in self.tq.registry),
        }
        template = "operations_live.html" if live else "operations.html"
        return self.web.page(
            request,
            template,
            context,
            visitor=visitor,
            status=422 if problems and not live else 200,
        )

    async def operation(
        self,
        request: Request,
        *,
        input_errors: dict[str, str] | None = None,
        input_values: dict[str, str] | None = None,
        message: str = "",
        status: int = 200,
        visitor: Visitor | None = None,
    ) -> Response:
        visitor = visitor or self.web.visitor(request, "read")
        live = request.url.path.endswith("/live")
        ref = (
            request.query_params.get("ref", "")
            if input_values is None
            else input_values.get("ref", "")
        )
        rec = await self.tq.aio.get(ref) if 0 < len(ref) <= self.max_ref else None
        if rec is None:
            raise Refusal(404, "Not found", "There is no operation with that ref.")
        schema = self.schema(rec.tool)
        detail = present.operation_page(rec, schema)
        fields = None
        if rec.state is State.NEEDS_INPUT and schema is not None:
            fields = forms.form_fields(schema, rec.args)
            if input_values is not None:
                fields = [refilled(f, input_values) for f in fields]
        context = {
            "title": rec.operation_ref,
            "op": detail,
            "rec": rec,
            "actions": actions_for(rec.state),
            "fields": fields,
            "input_errors": input_errors or {},
            "input_message": message,
            "tool_known": schema is not None,
            "resolutions": resolutions.resolutions(rec),
            "resolve_choices": resolutions.CHOICES,
            "operator_retries": self.tq.settings.recovery.operator_retries,
            "events_url": with_query(f"{base_path(request)}/events", ref=rec.operation_ref),
            "live_url": with_query(f"{base_path(request)}/operation/live", ref=rec.operation_ref),
        }
        template = "operation_live.html" if live else "operation.html"
        return self.web.page(request, template, context, visitor=visitor, status=status)

    def schema(self, tool: str) -> dict[str, Any] | None:
        try:
            return self.tq.registry.get(tool).input_schema()  # type: ignore[no-any-return]
        except errors.UnknownTool:
            return None


def list_problems(exc: errors.InvalidArguments) -> dict[str, str]:
    names = {"ref_contains": "ref", "older_than": "older_than", "q": "search"}
    out: dict[str, str] = {}
    for fe in exc.field_errors:
        out[names.get(fe.field, fe.field)] = scrub(fe.rule)[:200]
    return out or {"filters": scrub(exc.message)[:200]}


def refilled(f: forms.FormField, values: dict[str, str]) -> forms.FormField:
    """``f`` showing what was posted (never a secret: a secret field stays empty)."""
    if f.kind == "secret" or f.keeps_current:
        return f
    return replace(f, value=values.get(f.input_name, ""))
