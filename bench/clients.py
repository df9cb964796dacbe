"""The two clients the throughput benchmarks drive: toolq and bare Celery.

Both expose ``call(i)``: submit one call and block until its result is back
(toolq: ``submit`` then ``wait``; Celery: ``send_task`` then
``AsyncResult.get`` through the Redis result backend), and the two halves
apart (``submit(i)`` returns what ``wait`` takes), for the pattern of many
submits then many waits (:func:`bench.load.batch`).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from celery import Celery

from bench import apps, bare_app


class Client(Protocol):
    name: str

    def call(self, i: int) -> None: ...

    def submit(self, i: int) -> Any: ...

    def wait(self, handle: Any) -> None: ...

    def close(self) -> None: ...


class ToolqClient:
    name = "toolq"

    def __init__(self, url: str, tool: str = "noop", timeout: float = 120.0) -> None:
        self.tq = apps.tq
        self.tq.configure(redis_url=url)
        self.tool = tool
        self.timeout = timeout
        self.failures = 0
        self._lock = threading.Lock()

    def submit(self, i: int) -> str:
        return self.tq.submit(self.tool, {"n": i}).operation_ref

    def wait(self, ref: str) -> None:
        env = self.tq.wait(ref, timeout=self.timeout)
        if not env.ok:
            with self._lock:
                self.failures += 1

    def call(self, i: int) -> None:
        self.wait(self.submit(i))

    def close(self) -> None:
        self.tq.close()


class BareClient:
    name = "bare"

    def __init__(self, url: str, task: str = "bare.noop", timeout: float = 120.0) -> None:
        self.app: Celery = bare_app.make_app(url)
        self.task = task
        self.timeout = timeout
        self.failures = 0

    def submit(self, i: int) -> Any:
        return self.app.send_task(self.task, args=[i])

    def wait(self, result: Any) -> None:
        result.get(timeout=self.timeout)

    def call(self, i: int) -> None:
        self.wait(self.submit(i))

    def close(self) -> None:
        self.app.close()


def make_client(side: str, url: str, kind: str = "noop") -> ToolqClient | BareClient:
    if side == "toolq":
        return ToolqClient(url, {"noop": "noop", "sleep": "sleep100"}[kind])
    return BareClient(url, {"noop": "bare.noop", "sleep": "bare.sleep100"}[kind])
