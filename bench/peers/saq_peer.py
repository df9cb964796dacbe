"""saq at its defaults but for two worker processes: ``saq MODULE.settings --workers 2``
(concurrency 10 each, async functions); each job awaited with ``Job.refresh``."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
from saq import Queue

from bench import procs
from bench.peers import crash_key, url

queue = Queue.from_url(url(), name="bench-peers")
_client: redis.asyncio.Redis | None = None


async def noop(ctx: Any, *, n: int) -> None:
    return None


async def sleep100(ctx: Any, *, n: int) -> None:
    await asyncio.sleep(0.1)


async def crash_write(ctx: Any, *, n: int) -> None:
    global _client
    if _client is None:
        _client = redis.asyncio.Redis.from_url(url())
    await asyncio.sleep(0.05)
    await _client.incr(crash_key("saq", n))
    await asyncio.sleep(0.05)


settings = {"queue": queue, "functions": [noop, sleep100, crash_write]}
NAMES = {"noop": "noop", "sleep": "sleep100", "crash": "crash_write"}


class Adapter:
    name = "saq"
    concurrency = "20 (--workers 2 x concurrency 10, async)"

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()

    def start(self, url: str, tag: str) -> list[procs.Child]:
        argv = ["-m", "saq", f"{__name__}.settings", "--workers", "2"]
        return [procs.python_child(f"peers-{tag}saq", argv, {"BENCH_PEER_URL": url})]

    def submit(self, task: str, ids: range) -> Any:
        async def go() -> list[Any]:
            return [await queue.enqueue(NAMES[task], n=i) for i in ids]

        return self.loop.run_until_complete(go())

    def wait(self, handles: Any, timeout: float) -> int:
        async def go() -> int:
            failed = 0
            for job in handles:
                try:
                    await job.refresh(until_complete=timeout)
                    failed += job.status != "complete"
                except Exception:
                    failed += 1
            return failed

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(queue.disconnect())
        self.loop.close()
