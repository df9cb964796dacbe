"""Celery messages built ahead, so the ledger can publish them in the same
script call as the transition that needs them (one atomic step: no crash
between "queued" and "published" can lose or double a dispatch).

The format is Celery's task protocol 2 as kombu's Redis transport stores it:
what ``Producer.publish`` would ``LPUSH`` to the queue's list.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from json.encoder import encode_basestring_ascii
from typing import Any

from celery import Celery
from kombu.serialization import dumps

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

    def run(self, ref: str, attempt: int) -> tuple[str, str]:
        return self.calls_queue, self.raw(RUN_TASK, [ref, attempt], self.calls_queue)

    def verify(self, ref: str, attempt: int, vcheck: int) -> tuple[str, str]:
        return self.verify_queue, self.raw(VERIFY_TASK, [ref, attempt, vcheck], self.verify_queue)

    def raw(self, task: str, args: list[Any], queue: str) -> str:
        template, embed = self._templates.get((task, queue)) or self._template(task, queue)
        body = base64.b64encode(f"[{_json_list(args)},{{}},{embed}]".encode()).decode()
        return (
            template.replace(_ID, uuid4_hex())
            .replace(_TAG, uuid4_hex())
            .replace(_BODY, body)
            .replace(_REPR, encode_basestring_ascii(repr(tuple(args)))[1:-1])
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


_ID, _TAG, _BODY, _REPR = "@@toolq-id@@", "@@toolq-tag@@", "@@toolq-body@@", "@@toolq-repr@@"


def _json_list(args: list[Any]) -> str:
    """``json.dumps(args)`` for the strings and ints a task takes, without the encoder
    machinery (a scheduler batch builds one per message)."""
    if not all(type(a) is str or type(a) is int for a in args):
        return json.dumps(args)
    parts = (encode_basestring_ascii(a) if type(a) is str else str(a) for a in args)
    return "[" + ", ".join(parts) + "]"


def uuid4_hex() -> str:
    """``uuid.uuid4().hex``, without building a UUID object (a scheduler batch makes
    two per message; the object costs more than the random bytes)."""
    h = os.urandom(16).hex()
    return f"{h[:12]}4{h[13:16]}{'89ab'[int(h[16], 16) & 3]}{h[17:]}"


def message_ref(raw: bytes | str | None) -> str | None:
    """The operation_ref a raw toolq message carries (None for anything else)."""
    if raw is None:
        return None
    try:
        msg = json.loads(raw)
        args = json.loads(base64.b64decode(msg["body"]))[0]
        ref = args[0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return ref if isinstance(ref, str) else None
