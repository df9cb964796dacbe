"""Celery messages built ahead, so the ledger can publish them in the same
script call as the transition that needs them (one atomic step: no crash
between "queued" and "published" can lose or double a dispatch).

The format is Celery's task protocol 2 as kombu's Redis transport stores it:
what ``Producer.publish`` would ``LPUSH`` to the queue's list.
"""

from __future__ import annotations

import base64
import json
import socket
from typing import Any
from uuid import uuid4

from celery import Celery
from kombu.serialization import dumps

RUN_TASK = "toolq.run"
VERIFY_TASK = "toolq.verify"


class MessageFactory:
    def __init__(self, app: Celery, calls_queue: str, verify_queue: str) -> None:
        self.app = app
        self.calls_queue = calls_queue
        self.verify_queue = verify_queue
        self.origin = f"toolq@{socket.gethostname()}"

    def run(self, ref: str, attempt: int) -> tuple[str, str]:
        return self.calls_queue, self.raw(RUN_TASK, [ref, attempt], self.calls_queue)

    def verify(self, ref: str, attempt: int, vcheck: int) -> tuple[str, str]:
        return self.verify_queue, self.raw(VERIFY_TASK, [ref, attempt, vcheck], self.verify_queue)

    def raw(self, task: str, args: list[Any], queue: str) -> str:
        task_id = uuid4().hex
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
            delivery_tag=uuid4().hex,
        )
        message = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": tm.headers,
            "properties": properties,
        }
        return json.dumps(message, separators=(",", ":"))


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
