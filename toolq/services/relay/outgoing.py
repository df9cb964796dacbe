"""What the relay publishes, read from an outbox entry (pure; no I/O).

The ledger builds each message as kombu's Redis transport stores it
(:mod:`toolq.adapters.broker.messages`): a JSON envelope with the body in base64, the
task's headers, and properties. Any kombu transport takes the same message
from ``Producer.publish`` given the raw body, its content type and encoding,
the headers, and the properties Celery sets (``correlation_id``, ``reply_to``);
the transport adds its own (a delivery tag, Redis's base64 body encoding, AMQP
frames). So the relay unpacks the envelope into those arguments, and a worker
on RabbitMQ sees what Celery's own publish would have sent it.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from toolq.adapters.ledger.outbox import entry_ms

#: The properties of the ledger's message passed on to the broker; the transport
#: sets the others (delivery tag, body encoding, delivery info) itself.
PASSED_PROPERTIES = ("correlation_id", "reply_to")


@dataclass(frozen=True)
class Outgoing:
    """One outbox entry, ready for ``Producer.publish``."""

    id: str
    queue: str
    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    #: The message as the ledger built it: kombu's Redis transport's own envelope,
    #: what a Redis broker's queue list holds (the relay pushes it as it is there).
    raw: str = ""


def outgoing(entry_id: str, fields: dict[str, str]) -> Outgoing | None:
    """The message an outbox entry holds; None when it is not one (nothing the
    ledger wrote: the relay drops it rather than block the stream behind it)."""
    queue, raw = fields.get("queue"), fields.get("message")
    if not queue or not raw:
        return None
    try:
        msg = json.loads(raw)
        body = base64.b64decode(msg["body"], validate=True)
        headers = msg.get("headers", {})
        props = msg.get("properties", {})
        content_type = str(msg.get("content-type") or "application/json")
        content_encoding = str(msg.get("content-encoding") or "utf-8")
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    if not isinstance(headers, dict) or not isinstance(props, dict):
        return None
    passed = {k: props[k] for k in PASSED_PROPERTIES if props.get(k)}
    return Outgoing(entry_id, queue, body, content_type, content_encoding, headers, passed, raw)


def lag_ms(entry_ids: list[str], now_ms: int) -> int:
    """How long the oldest of these entries waited in the outbox (ms, 0 for none)."""
    times = [t for t in map(entry_ms, entry_ids) if t > 0]
    return max(0, now_ms - min(times)) if times else 0
