"""The console's actions: an operator's approve, retry, verify, cancel (one ref or many),
new arguments for an operation that needs input, and settling an escalated one; each
through ``tq.aio`` with ``by="console:<who>"``, CSRF checked, in the scope it needs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from toolq.core import errors
from toolq.core.redact import scrub
from toolq.edges.api.console import forms, resolutions
from toolq.edges.api.console.verbs import ACTIONS, MAX_BULK, Action
from toolq.edges.api.console.web import (
    Refusal,
    Web,
    base_path,
    form_text,
    json_answer,
    local_url,
    wants_json,
    with_query,
)

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue
    from toolq.edges.api.console.pages import Pages

#: Fields an action's form may carry: the refs and a few more.
FORM_FIELDS = MAX_BULK + 200


class Actions:
    """The state-changing requests over ``tq`` (POST, CSRF checked)."""

    def __init__(self, tq: ToolQueue, web: Web, pages: Pages) -> None:
        self.tq = tq
        self.web = web
        self.pages = pages
        self.max_ref = tq.settings.limits.max_ref_length

    async def act(self, request: Request) -> Response:
        action = ACTIONS.get(request.path_params.get("action", ""))
        if action is None:
            raise Refusal(404, "Not found", "There is no such action.")
        visitor, form = await self.web.form_visitor(request, action.scope, FORM_FIELDS)
        ref = form_text(form.get("ref"))
        back = with_query(f"{base_path(request)}/operation", ref=ref)
        try:
            state = await self._do(action, ref, visitor.actor)
        except errors.RequestRefused as exc:
            if isinstance(exc, errors.ServerUnavailable):
                raise
            message = f"Could not {action.label.lower()}: {_refusal_text(exc)}"
            if wants_json(request):
                return json_answer(False, message, _REFUSAL_STATUS.get(type(exc), 409))
            return self.web.redirect(request, back, [("error", message)])
        message = f"{ref}: {action.done} (now {state})."
        if wants_json(request):
            return json_answer(True, message, state=str(state))
        return self.web.redirect(request, back, [("ok", message)])

    async def _do(self, action: Action, ref: str, by: str) -> Any:
        aio = self.tq.aio
        if action.name == "approve":
            return await aio.approve(ref, by=by)
        if action.name == "cancel":
            return await aio.cancel(ref, by=by)
        if action.name == "retry":
            return await aio.retry_now(ref, by=by)
        return await aio.verify_now(ref, by=by)

    async def bulk(self, request: Request) -> Response:
        visitor, form = await self.web.form_visitor(request, None, FORM_FIELDS)
        action = ACTIONS.get(form_text(form.get("action")))
        base = base_path(request)
        back = local_url(request, form_text(form.get("back")), f"{base}/operations")
        if action is None or not action.bulk:
            return self.web.redirect(request, back, [("error", "Choose an action.")])
        if not visitor.may(action.scope):
            raise Refusal(403, "Not allowed", f"Your token does not have the {action.scope} scope.")
        refs = [form_text(r) for r in form.getlist("ref")]
        refs = list(dict.fromkeys(r for r in refs if r))[:MAX_BULK]
        if not refs:
            return self.web.redirect(request, back, [("error", "Select at least one operation.")])
        done: list[str] = []
        refused: list[str] = []
        for ref in refs:
            try:
                await self._do(action, ref, visitor.actor)
                done.append(ref)
            except errors.RequestRefused as exc:
                if isinstance(exc, errors.ServerUnavailable):
                    raise
                refused.append(f"{ref}: {_refusal_text(exc)}")
        flash = []
        if done:
            flash.append(("ok", f"{action.label}: {len(done)} of {len(refs)} {action.done}."))
        for line in refused[:10]:
            flash.append(("error", f"{action.label} refused for {line}"))
        if len(refused) > 10:
            flash.append(("error", f"… and {len(refused) - 10} more refused."))
        return self.web.redirect(request, back, flash)

    async def provide_input(self, request: Request) -> Response:
        visitor, form = await self.web.form_visitor(request, "input", FORM_FIELDS)
        ref = form_text(form.get("ref"))
        rec = await self.tq.aio.get(ref) if 0 < len(ref) <= self.max_ref else None
        if rec is None:
            raise Refusal(404, "Not found", "There is no operation with that ref.")
        back = with_query(f"{base_path(request)}/operation", ref=ref)
        schema = self.pages.schema(rec.tool)
        if schema is None:
            raise Refusal(
                409, "Unknown tool", "This API process does not know the operation's tool."
            )
        values = {k: form_text(v) for k, v in form.multi_items()}
        fields = forms.form_fields(schema, rec.args)
        args, problems = forms.parse_form(fields, values, rec.args)
        message = "Some fields need fixing." if problems else ""
        if not problems:
            try:
                await self.tq.aio.provide_input(ref, args, by=visitor.actor)
            except errors.InvalidArguments as exc:
                problems, message = _field_problems(exc, {f.name for f in fields})
            except errors.RequestRefused as exc:
                if isinstance(exc, errors.ServerUnavailable):
                    raise
                return self.web.redirect(request, back, [("error", _refusal_text(exc))])
            else:
                return self.web.redirect(request, back, [("ok", f"{ref}: new arguments queued.")])
        return await self.pages.operation(
            request,
            input_errors=problems,
            input_values=values,
            message=message,
            status=422,
            visitor=visitor,
        )

    async def resolve(self, request: Request) -> Response:
        """Settle an escalated operation: committed, not committed or retry, with a
        reason (and a result or reference for committed), bound to the revision shown."""
        visitor, form = await self.web.form_visitor(request, resolutions.SCOPE, FORM_FIELDS)
        ref = form_text(form.get("ref"))
        outcome = form_text(form.get("outcome"))
        back = with_query(f"{base_path(request)}/operation", ref=ref)
        label = dict((o, label) for o, label, _ in resolutions.CHOICES).get(outcome, "Resolve")
        try:
            state = await self.tq.aio.resolve(
                ref,
                outcome,
                reason=form_text(form.get("reason")),
                result=_json_field(form_text(form.get("result"))),
                reference=form_text(form.get("reference")).strip(),
                rev=form_text(form.get("rev")),
                by=visitor.actor,
            )
        except errors.RequestRefused as exc:
            if isinstance(exc, errors.ServerUnavailable):
                raise
            message = f"Could not {label.lower()}: {_refusal_text(exc)}"
            if wants_json(request):
                return json_answer(False, message, _status(exc))
            return self.web.redirect(request, back, [("error", message)])
        message = f"{ref}: {label.lower()} by {visitor.actor} (now {state})."
        if wants_json(request):
            return json_answer(True, message, state=str(state))
        return self.web.redirect(request, back, [("ok", message)])


def _json_field(text: str) -> Any:
    """A form's JSON field: None when empty; refused (typed) when it is not JSON."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.InvalidArguments(
            f"the result is not valid JSON ({exc.msg} at position {exc.pos})",
            code_hint="BAD_RESULT",
        ) from None
    except (ValueError, RecursionError):
        # An integer over Python's 4,300 digits, or nesting deeper than the parser
        # goes: both were a 500.
        raise errors.InvalidArguments(
            "the result is not JSON data this console reads (too long a number, or "
            "nested too deep)",
            code_hint="BAD_RESULT",
        ) from None


def _status(exc: errors.RequestRefused) -> int:
    return next((s for cls, s in _REFUSAL_STATUS.items() if isinstance(exc, cls)), 409)


_REFUSAL_STATUS: dict[type[errors.RequestRefused], int] = {
    errors.OperationNotFound: 404,
    errors.InvalidArguments: 422,
    errors.InvalidState: 409,
}


def _refusal_text(exc: errors.RequestRefused) -> str:
    hint = exc.details.get("code_hint")
    code = hint if isinstance(hint, str) else exc.code
    return f"{scrub(exc.message)[:200]} ({code})"


def _field_problems(exc: errors.InvalidArguments, names: set[str]) -> tuple[dict[str, str], str]:
    """The tool's validation errors by form field; the rest in one message."""
    hint = exc.details.get("code_hint")
    problems: dict[str, str] = {}
    other: list[str] = []
    for fe in exc.field_errors:
        top = fe.field.split(".")[0]
        text = fe.rule.replace("_", " ")
        if top in names:
            where = fe.field[len(top) + 1 :]
            problems[top] = f"{where}: {text}" if where else text
        else:
            other.append(f"{fe.field}: {text}")
    if hint == "ARGUMENTS_UNCHANGED":
        return problems, "These are the arguments that needed fixing: change at least one."
    if other:
        return problems, "; ".join(other)
    return problems, "Some fields need fixing: see below." if problems else scrub(exc.message)[:200]
