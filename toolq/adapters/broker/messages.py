"""Celery messages built ahead, so the ledger can publish them in the same
script call as the transition that needs them (one atomic step: no crash
between "queued" and "published" can lose or double a dispatch).

The format is Celery's task protocol 2 as kombu's Redis transport stores it:
what ``Producer.publish`` would ``LPUSH`` to the queue's list.

**What Flower shows** (with task events on, ``toolq worker -E``). A task's
arguments are ``('op_…', 1)``; the message's ``argsrepr`` names the tool
instead, ``create_invoice('op_…', attempt=1)`` (:func:`args_repr`), when the
builder is given the tool (:meth:`toolq.client.app.App.outbound_for`). A task's
state is what its body ends with: a task whose attempt or check leaves the
operation anything but succeeded raises :class:`OperationNotSucceeded` (a
``throws`` exception: logged on one line, the message acknowledged, never
retried by Celery), so Flower shows it FAILURE with the state and the code,
``OperationNotSucceeded('escalated ATTEMPTS_EXHAUSTED')``; a succeeded one,
or a copy of a delivery that had nothing to do, is SUCCESS with what happened
as its result. The ledger, not Celery's result, remains the record.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
from enum import StrEnum
from json.encoder import encode_basestring_ascii
from typing import Any

from celery import Celery
from celery.exceptions import Reject
from kombu.serialization import dumps

from toolq.core.ids import uuid4_hex
from toolq.core.states import State

RUN_TASK = "toolq.run"
VERIFY_TASK = "toolq.verify"


class MessageFactory:
    """Builds toolq's task messages from one template per task, made by Celery itself.

    ``as_task_v2`` costs about 100 us a call; a message differs from its template
    only in its ids, its arguments and their repr, so those are all this fills in.
    """

    def __init__(self, app: Celery, calls_queue: str, verify_queue: str) -> None:
        self.app = app
        self.calls_queue = calls_queue
        self.verify_queue = verify_queue
        self.origin = f"toolq@{socket.gethostname()}"
        self._templates: dict[tuple[str, str], tuple[str, str]] = {}

    def run(self, ref: str, attempt: int, tool: str = "") -> tuple[str, str]:
        args = [ref, attempt]
        shown = args_repr(tool, args, ("attempt",))
        return self.calls_queue, self.raw(RUN_TASK, args, self.calls_queue, shown)

    def verify(self, ref: str, attempt: int, vcheck: int, tool: str = "") -> tuple[str, str]:
        args = [ref, attempt, vcheck]
        shown = args_repr(tool, args, ("attempt", "check"))
        return self.verify_queue, self.raw(VERIFY_TASK, args, self.verify_queue, shown)

    def raw(self, task: str, args: list[Any], queue: str, shown: str | None = None) -> str:
        """The message; ``shown`` is its ``argsrepr`` (what Flower and the worker's log
        show as its arguments), ``repr(tuple(args))`` if not given."""
        template, embed = self._templates.get((task, queue)) or self._template(task, queue)
        body = base64.b64encode(f"[{_json_list(args)},{{}},{embed}]".encode()).decode()
        shown = repr(tuple(args)) if shown is None else shown
        return (
            template.replace(_ID, uuid4_hex())
            .replace(_TAG, uuid4_hex())
            .replace(_BODY, body)
            .replace(_REPR, encode_basestring_ascii(shown)[1:-1])
        )

    def reference(self, task: str, args: list[Any], queue: str, task_id: str) -> dict[str, Any]:
        """The message exactly as Celery and kombu would build it (what the template copies)."""
        tm = self.app.amqp.as_task_v2(
            task_id, task, args=tuple(args), origin=self.origin, ignore_result=True
        )
        content_type, content_encoding, data = dumps(tm.body, serializer="json")
        body: bytes = data.encode(content_encoding or "utf-8") if isinstance(data, str) else data
        properties = dict(tm.properties)
        properties.update(
            delivery_mode=2,
            priority=0,
            delivery_info={"exchange": "", "routing_key": queue},
            body_encoding="base64",
        )
        return {
            "body": base64.b64encode(body).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": tm.headers,
            "properties": properties,
            "embed": tm.body[2],
        }

    def _template(self, task: str, queue: str) -> tuple[str, str]:
        t = self.reference(task, [], queue, _ID)
        embed = json.dumps(t.pop("embed"), separators=(",", ":"))
        t["body"] = _BODY
        t["headers"]["argsrepr"] = _REPR
        t["properties"]["delivery_tag"] = _TAG
        template = json.dumps(t, separators=(",", ":"))
        self._templates[(task, queue)] = (template, embed)
        return template, embed


def args_repr(tool: str, args: list[Any], names: tuple[str, ...]) -> str:
    """A task's arguments as Flower shows them: a call of the tool on the ref,
    ``create_invoice('op_1', attempt=2)``. Without the tool: Celery's own repr."""
    if not tool:
        return repr(tuple(args))
    named = ", ".join(f"{n}={v!r}" for n, v in zip(names, args[1:], strict=True))
    return f"{tool}({args[0]!r}, {named})"


_ID, _TAG, _BODY, _REPR = "@@toolq-id@@", "@@toolq-tag@@", "@@toolq-body@@", "@@toolq-repr@@"


class OperationNotSucceeded(Exception):
    """A task's attempt or check left its operation in another state than succeeded.

    Raised by the task body after the ledger recorded it, only so that Celery's
    events (Flower) report a failure: the task is declared to throw it.
    """


class Requeue(Reject):
    """Raised by a task body to give its delivery back to its queue, the tool not
    called: the ledger's server did not take the claim (``reason`` says which call).

    Celery's tracer rejects the message with requeue, even with late acks, and the
    broker delivers it again; each delivery waits out the claim's patience first,
    so this is not a hot loop. Celery logs it at WARNING with a traceback: the
    filter :func:`quiet_requeues` installs leaves its one line. On a RabbitMQ quorum
    queue with a ``delivery-limit`` (RabbitMQ 4 defaults to 20; 3.x sets none) a
    message requeued that often is dropped: its operation stays ``queued`` in the
    ledger, and the scheduler publishes it again after ``recovery.unclaimed_after``.
    """

    def __init__(self, reason: str | None = None, requeue: bool = True) -> None:
        # The same arguments as Reject's: a prefork child sends a copy to its parent.
        super().__init__(reason, requeue)

    def __repr__(self) -> str:  # what Celery's line shows after the task's name and id
        return f"requeued: {self.args[0]}"


class _RequeueLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], Requeue):
            record.exc_info = None  # a routine event: its line, not a traceback
            record.exc_text = None
        return True


_requeue_line = _RequeueLine()


def quiet_requeues() -> None:
    """Celery's log line of a :class:`Requeue` without its traceback. Idempotent."""
    trace = logging.getLogger("celery.app.trace")
    if _requeue_line not in trace.filters:
        trace.addFilter(_requeue_line)


class _NoEtaWarning(logging.Filter):
    """Drops kombu's "ETA tasks published to this exchange will block the worker" (one
    per queue, every worker start on RabbitMQ): Celery sets up native delayed delivery
    for quorum queues and warns that toolq's direct exchanges cannot have it, but toolq
    never publishes with an ETA or countdown (a delay waits in the ledger's due set, the
    scheduler publishes when it is due), so nothing it could block exists."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "ETA tasks published to this exchange" not in record.getMessage()


_no_eta_warning = _NoEtaWarning()
#: kombu's logger for native delayed delivery (kombu.utils.log.get_logger(__name__)).
DELAYED_DELIVERY_LOGGER = "kombu.transport.native_delayed_delivery"


def quiet_eta_warnings() -> None:
    """Without kombu's ETA warning (:class:`_NoEtaWarning`). Idempotent."""
    delayed = logging.getLogger(DELAYED_DELIVERY_LOGGER)
    if _no_eta_warning not in delayed.filters:
        delayed.addFilter(_no_eta_warning)


class Outcome(str):
    """What a task body did (a state, or ``duplicate``, ``stale``, ...), with the
    code of the transition it recorded. Equal to the plain string."""

    code: str | None

    def __new__(cls, value: str, code: str | None = None) -> Outcome:
        out = super().__new__(cls, value)
        out.code = code
        return out


class Delivery(StrEnum):
    """What a task body did with a delivery when it recorded no transition (equal to
    the plain string: the task's result and its log line read the same)."""

    #: A copy of a delivery a live worker holds: dropped.
    DUPLICATE = "duplicate"
    #: The operation moved on (another attempt or check): nothing to do.
    STALE = "stale"
    #: No such operation (expired): nothing to do.
    MISSING = "missing"
    #: Claimed by another process.
    HELD = "held"
    #: The claim was not confirmed on disk or by a replica: the tool was not called.
    NOT_DURABLE = "not_durable"
    #: This worker does not have the tool: the operation was left for another.
    UNKNOWN_TOOL = "unknown_tool"
    #: Its dependency key held it back (waiting_retry DEPENDENCY_LIMITED, issue 28):
    #: the tool was not called, no attempt spent; the scheduler sends it again.
    LIMITED = "limited"


#: Outcomes of a delivery that found nothing to do (a copy, an operation that moved
#: on): the task did its job, and the operation is none of its business.
NOTHING_TO_DO = frozenset(
    {Delivery.DUPLICATE, Delivery.STALE, Delivery.MISSING, Delivery.HELD, Delivery.LIMITED}
)
#: What a task body returns when the ledger refused its transition: this, then the reason.
REFUSED = "refused:"


def task_result(outcome: str) -> str:
    """The task's return value, or :class:`OperationNotSucceeded` (see the module docstring)."""
    if outcome == State.SUCCEEDED or outcome in NOTHING_TO_DO or outcome.startswith(REFUSED):
        return str(outcome)
    code = getattr(outcome, "code", None)
    raise OperationNotSucceeded(f"{outcome} {code}" if code else str(outcome))


def _json_list(args: list[Any]) -> str:
    """``json.dumps(args)`` for the strings and ints a task takes, without the encoder
    machinery (a scheduler batch builds one per message)."""
    if not all(type(a) is str or type(a) is int for a in args):
        return json.dumps(args)
    parts = (encode_basestring_ascii(a) if type(a) is str else str(a) for a in args)
    return "[" + ", ".join(parts) + "]"


def message_ref(raw: bytes | str | None) -> str | None:
    """The operation_ref a raw toolq message carries (None for anything else)."""
    decoded = _decoded(raw)
    return decoded[0][0] if decoded else None


def message_head(raw: bytes | str | None) -> tuple[str | None, int, bool]:
    """(ref, attempt or check, redelivered) of a raw toolq message; (None, 0, False) for
    anything else. The attempt of a run, the check of a verification: its last argument.
    kombu marks a message it pushed back (a restore, a requeue) in its headers."""
    decoded = _decoded(raw)
    if decoded is None:
        return None, 0, False
    args, headers = decoded
    try:
        seq = int(args[-1])
    except (ValueError, TypeError):
        return None, 0, False
    return args[0], seq, bool(headers.get("redelivered"))


def _decoded(raw: bytes | str | None) -> tuple[list[Any], dict[str, Any]] | None:
    """A raw toolq message's arguments (a ref first) and headers; None for anything else."""
    if raw is None:
        return None
    try:
        msg = json.loads(raw)
        args = json.loads(base64.b64decode(msg["body"]))[0]
        headers = msg.get("headers") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    if not (isinstance(args, list) and args and isinstance(args[0], str)):
        return None
    return args, headers if isinstance(headers, dict) else {}
