"""An operation as an MCP task (SEP-2663, ``io.modelcontextprotocol/tasks``): pure.

Everything here reads an :class:`~toolq.core.record.OperationRecord` (or a state
and its envelope) and a clock, and returns the wire shapes as dicts:

===========================================  ================  ==========================
toolq state                                  task status       payload
===========================================  ================  ==========================
queued, running, waiting_retry, verifying    ``working``       ``statusMessage`` says what
                                                               toolq is doing
needs_input                                  ``input_required``  a form for corrected
                                                               arguments (``inputRequests``)
awaiting_approval                            ``input_required``  a yes/no approval form
succeeded, failed, escalated                 ``completed``     the ``CallToolResult`` inline
                                                               (``isError`` for ok=false)
cancelled                                    ``cancelled``
===========================================  ================  ==========================

A task ends when its operation is escalated: ``completed`` is final in the
extension. An operator may still retry an escalated write (``tq.resolve``); its
task then stays ``completed`` with the escalation as its result until the retry
settles, and the retry is followed with ``get_operation`` (:func:`reopened`).

``failed`` (a task status) is for JSON-RPC errors only, and toolq answers every
call with an envelope, so no operation maps to it. An input request's key names
what it asks and the attempt it belongs to (``approval-0``, ``arguments-2``):
each attempt can ask at most once, so a key never comes back for another
question (the extension requires keys unique over a task's life).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from toolq.core.envelope import AnyEnvelope, Category, ToolError
from toolq.core.own_envelopes import FIXED, escalation_envelope
from toolq.core.record import OperationRecord
from toolq.core.redact import scrub, shown_args
from toolq.core.render import to_mcp_result
from toolq.core.states import State

EXTENSION = "io.modelcontextprotocol/tasks"

TaskStatus = Literal["working", "input_required", "completed", "cancelled"]

_STATUS: dict[State, TaskStatus] = {
    State.QUEUED: "working",
    State.RUNNING: "working",
    State.WAITING_RETRY: "working",
    State.VERIFYING: "working",
    State.NEEDS_INPUT: "input_required",
    State.AWAITING_APPROVAL: "input_required",
    State.SUCCEEDED: "completed",
    State.FAILED: "completed",
    State.ESCALATED: "completed",
    State.CANCELLED: "cancelled",
}

#: How much of the arguments an approval form quotes (they are the caller's own).
ARGS_QUOTE = 400
#: A tool's progress message is cut to this length before it reaches a client.
PROGRESS_TEXT = 200


def task_status(state: State) -> TaskStatus:
    return _STATUS[state]


# --------------------------------------------------------------------------- messages


def describe(
    state: State,
    envelope: AnyEnvelope | None,
    attempt: int | None = None,
    max_attempts: int | None = None,
) -> str:
    """One line saying what toolq is doing with an operation in ``state``.

    Used as the task's ``statusMessage`` and as a progress message; only
    toolq's own words and envelope codes (UPPER_SNAKE, never upstream text).
    """
    of = f" {attempt} of {max_attempts}" if attempt and max_attempts else ""
    error = envelope if isinstance(envelope, ToolError) else None
    if state is State.QUEUED:
        return f"queued: attempt{of} starts when a worker takes it" if of else "queued"
    if state is State.RUNNING:
        return f"running attempt{of}" if of else "running"
    if state is State.WAITING_RETRY:
        when = error.retry.not_before if error is not None else None
        at = f" until {when:%H:%M:%S} UTC" if when is not None else ""
        return f"waiting{at} to retry after {_delay_reason(error)}"
    if state is State.VERIFYING:
        return "checking whether the write happened before anything is sent again"
    if state is State.NEEDS_INPUT:
        wrong = (error.field_errors or []) if error is not None else []
        fields = ", ".join(f"{f.field} ({f.rule})" for f in wrong[:5])
        return f"needs corrected arguments: {fields}" if fields else "needs corrected arguments"
    if state is State.AWAITING_APPROVAL:
        return "waiting for approval before it runs"
    if state is State.SUCCEEDED:
        return "succeeded"
    if state is State.CANCELLED:
        return "cancelled"
    code = f": {error.code}" if error is not None else ""
    return f"failed{code}" if state is State.FAILED else f"escalated to an operator{code}"


def _delay_reason(error: ToolError | None) -> str:
    if error is not None and error.code == "RATE_LIMITED":
        return "a rate limit"
    if error is not None and error.category is Category.DEPENDENCY:
        return "a dependency was unavailable"
    return "a temporary failure"


def progress_text(fraction: float, message: str | None) -> str:
    """A tool's progress report as a notification message: percent, then its words."""
    percent = f"{round(max(0.0, min(1.0, fraction)) * 100)}%"
    if not message:
        return percent
    return f"{percent} {scrub(message)[:PROGRESS_TEXT]}"


# --------------------------------------------------------------------------- tasks


def stamp(when: datetime) -> str:
    """ISO 8601 in UTC with a ``Z``, to the millisecond."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def poll_interval_ms(record: OperationRecord, poll: float, now: datetime) -> int:
    """The poll interval; while a retry waits, no sooner than its ``not_before``."""
    interval = poll
    env = record.envelope
    waits_until = env.retry.not_before if isinstance(env, ToolError) else None
    if record.state is State.WAITING_RETRY and waits_until is not None:
        interval = max(interval, (waits_until - now).total_seconds())
    return max(1, math.ceil(interval * 1000))


def reopened(record: OperationRecord) -> bool:
    """An escalated operation an operator retried, not settled again: its task ended
    at the escalation (``completed`` is final), so it stays completed."""
    return record.operator_retries > 0 and task_status(record.state) in (
        "working",
        "input_required",
    )


def task(record: OperationRecord, *, poll: float, now: datetime) -> dict[str, Any]:
    """The ``Task`` fields shared by ``CreateTaskResult`` and ``tasks/get``."""
    if reopened(record):
        status: TaskStatus = "completed"
        message = "escalated, then retried by an operator: follow it with get_operation"
    else:
        status = task_status(record.state)
        message = describe(record.state, record.envelope, record.attempt, record.max_attempts)
    return {
        "taskId": record.operation_ref,
        "status": status,
        "statusMessage": message,
        "createdAt": stamp(record.created_at),
        "lastUpdatedAt": stamp(record.updated_at),
        # toolq keeps an operation as long as its retention allows; it sets no TTL of its own.
        "ttlMs": None,
        "pollIntervalMs": poll_interval_ms(record, poll, now),
    }


def created(record: OperationRecord, *, poll: float, now: datetime) -> dict[str, Any]:
    """A ``CreateTaskResult``: what ``tools/call`` answers for a call still under way."""
    return {"resultType": "task", **task(record, poll=poll, now=now)}


def detailed(
    record: OperationRecord,
    *,
    poll: float,
    now: datetime,
    input_schema: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A ``tasks/get`` result: the task with its status's payload inlined."""
    out = {"resultType": "complete", **task(record, poll=poll, now=now)}
    status = out["status"]
    if status == "completed":
        out["result"] = {"resultType": "complete", **to_mcp_result(final_envelope(record))}
    elif status == "input_required":
        out["inputRequests"] = input_requests(record, input_schema)
    return out


def final_envelope(record: OperationRecord) -> AnyEnvelope:
    """A settled operation's envelope (every terminal transition writes one); for a
    :func:`reopened` one, the escalation its task ended with."""
    if record.envelope is not None and not reopened(record):
        return record.envelope
    # The escalation's own code where toolq has a fixed envelope for it (a lost
    # worker's is OUTCOME_UNVERIFIABLE's words); else: a person must check.
    codes = [h.code for h in record.history if h.to is State.ESCALATED and h.code in FIXED]
    code = codes[-1] if codes else "OUTCOME_UNVERIFIABLE"
    return escalation_envelope(code, record.operation_ref, record.tool, record.call_id)


# --------------------------------------------------------------------------- input


def input_key(record: OperationRecord) -> str | None:
    """The key of the one question an operation waiting on someone asks, else None."""
    if record.state is State.AWAITING_APPROVAL:
        return f"approval-{record.attempt}"
    if record.state is State.NEEDS_INPUT:
        return f"arguments-{record.attempt}"
    return None


def input_requests(
    record: OperationRecord, input_schema: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``inputRequests``: one form elicitation, for approval or corrected arguments."""
    key = input_key(record)
    if key is None:
        return {}
    if record.state is State.AWAITING_APPROVAL:
        shown = shown_args(record.args, input_schema)
        quoted = json.dumps(shown, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        if len(quoted) > ARGS_QUOTE:
            quoted = quoted[: ARGS_QUOTE - 1] + "…"
        message = f"Approve {record.tool} with these arguments? {quoted}"
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "approve": {
                    "type": "boolean",
                    "title": "Approve",
                    "description": "Yes runs it with these arguments; no cancels it.",
                }
            },
            "required": ["approve"],
        }
    else:
        message = (
            f"{record.tool} {describe(record.state, record.envelope)}; "
            "correct them (the other arguments stay as they are)."
        )
        schema = form_schema(input_schema or {}, record.args)
    return {
        key: {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": schema},
        }
    }


_STRING_KEYS = ("title", "description", "minLength", "maxLength")
_NUMBER_KEYS = ("title", "description", "minimum", "maximum")
_FORMATS = frozenset({"date", "date-time", "email", "uri"})
_PYTHON: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def form_schema(input_schema: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """An elicitation form for a tool's arguments: its top-level primitive properties.

    Forms hold flat primitives only (strings, numbers, booleans, string enums),
    so nested properties are left out (they keep their value). Each field's
    ``default`` is its current value, so the form opens on what was sent.
    """
    defs = input_schema.get("$defs") or {}
    props: dict[str, Any] = {}
    for name, raw in (input_schema.get("properties") or {}).items():
        prop = _primitive(raw, defs)
        if prop is None:
            continue
        value = current.get(name)
        kinds = _PYTHON.get(prop["type"], ())
        fits = isinstance(value, kinds) and (prop["type"] == "boolean") == isinstance(value, bool)
        if fits and ("enum" not in prop or value in prop["enum"]):
            prop["default"] = value
        props[name] = prop
    out: dict[str, Any] = {"type": "object", "properties": props}
    required = [n for n in input_schema.get("required") or () if n in props]
    if required:
        out["required"] = required
    return out


def _primitive(raw: Any, defs: Mapping[str, Any]) -> dict[str, Any] | None:
    """``raw`` as one of the form's primitive schemas, or None if it is not one."""
    if not isinstance(raw, Mapping):
        return None
    ref = raw.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.removeprefix("#/$defs/"))
        return _primitive({**(target or {}), **{k: v for k, v in raw.items() if k != "$ref"}}, {})
    options = raw.get("anyOf")
    if isinstance(options, list):  # Optional[X]: X, or null
        kept = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
        if len(kept) != 1:
            return None
        inner = _primitive(kept[0], defs)
        if inner is not None:
            inner.update({k: raw[k] for k in ("title", "description") if k in raw})
        return inner
    kind = raw.get("type")
    enum = raw.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        out = {k: raw[k] for k in ("title", "description") if k in raw}
        return {**out, "type": "string", "enum": list(enum)}
    if kind == "string":
        out = {k: raw[k] for k in _STRING_KEYS if k in raw}
        if raw.get("format") in _FORMATS:
            out["format"] = raw["format"]
        return {**out, "type": "string"}
    if kind in ("integer", "number"):
        return {**{k: raw[k] for k in _NUMBER_KEYS if k in raw}, "type": kind}
    if kind == "boolean":
        return {**{k: raw[k] for k in ("title", "description") if k in raw}, "type": "boolean"}
    return None


@dataclass(frozen=True)
class Answer:
    """What a ``tasks/update`` asks toolq to do with the outstanding question.

    ``action``: ``approve``, ``input`` (with ``arguments``, the corrected set),
    ``cancel`` (the person said no), or ``none`` (dismissed, or not the
    question outstanding now: the extension says to ignore those).
    """

    action: Literal["approve", "input", "cancel", "none"]
    arguments: dict[str, Any] | None = None


class BadAnswer(ValueError):
    """The response to the outstanding question is not an elicitation result."""


def answer(record: OperationRecord, responses: Mapping[str, Any]) -> Answer:
    """Read ``inputResponses`` against the question ``record`` asks now."""
    key = input_key(record)
    if key is None or key not in responses:
        return Answer("none")
    response = responses[key]
    if not isinstance(response, Mapping) or response.get("action") not in (
        "accept",
        "decline",
        "cancel",
    ):
        raise BadAnswer(f"inputResponses[{key!r}] must be an elicitation result")
    content = response.get("content")
    if content is not None and not isinstance(content, Mapping):
        raise BadAnswer(f"inputResponses[{key!r}].content must be an object")
    action, given = response["action"], dict(content or {})
    if action == "cancel":
        return Answer("none")  # dismissed without a choice: the question stays open
    if action == "decline":
        return Answer("cancel")
    if record.state is State.AWAITING_APPROVAL:
        decision = given.get("approve")
        if not isinstance(decision, bool):
            raise BadAnswer(f"inputResponses[{key!r}].content.approve must be true or false")
        return Answer("approve") if decision else Answer("cancel")
    changed = {k: v for k, v in given.items() if v is not None}
    return Answer("input", {**record.args, **changed})
