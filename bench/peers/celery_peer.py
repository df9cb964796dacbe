"""Bare Celery as ``pip install celery[redis]`` ships it (:mod:`bench.bare_app`): prefork -c 2,
early acks, prefetch 4, the Redis result backend it needs to be awaited."""

from __future__ import annotations

from typing import Any

from bench import procs
from bench.clients import BareClient

TASKS = {"noop": "bare.noop", "sleep": "bare.sleep100", "crash": "bare.crash_write"}


class Adapter:
    name = "celery"
    concurrency = "2 (prefork -c 2)"

    def __init__(self, url: str) -> None:
        self.client = BareClient(url)

    def start(self, url: str, tag: str) -> list[procs.Child]:
        return [
            procs.bare_worker(
                f"peers-{tag}celery-worker", url, pool="prefork", concurrency=2, queues="bare.calls"
            )
        ]

    def submit(self, task: str, ids: range) -> Any:
        return [self.client.app.send_task(TASKS[task], args=[i]) for i in ids]

    def wait(self, handles: Any, timeout: float) -> int:
        failed = 0
        for r in handles:
            try:
                r.get(timeout=timeout)
            except Exception:
                failed += 1
        return failed

    def close(self) -> None:
        self.client.close()
