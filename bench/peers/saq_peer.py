"""saq at its defaults but for two worker processes: ``saq MODULE.settings --workers 2``
(concurrency 10 each, async functions); each job awaited with ``Job.refresh``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis.asyncio
from saq import Queue
from saq.queue.redis import RedisQueue

from bench import procs
from bench.peers import crash_key, gc_threshold_from_env, url
from bench.peers.http_call import get_after
from bench.peers.inflight import InFlight

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

#: The asyncio-pool bench's (:mod:`bench.aio_pool_bench`): one worker process
#: (``saq bench.peers.saq_peer.aio_settings``) at ``BENCH_AIO_CONCURRENCY``.
AIO_QUEUE = "bench-aio"
#: redis-py 5's default bound on an asyncio pool's connections (saq supports redis < 8;
#: arq's venv has 5). redis-py 8 (toolq's) bounds it at 100: saq's worker holds one
#: connection per waiting dequeue (a BLMOVE each), and at concurrency 2,000 its process
#: tasks died of ``MaxConnectionsError``.
AIO_MAX_CONNECTIONS = 2**31
aio_inflight = InFlight(url())
gc_threshold_from_env()  # a configured variant only (bench.peers.GC_THRESHOLD_ENV)


async def await_sleep(ctx: Any, *, seconds: float) -> None:
    await aio_inflight.counted(asyncio.sleep(seconds))


async def await_http(ctx: Any, *, seconds: float, url: str) -> None:
    """The bench's ``http`` tool body, as toolq's (:mod:`bench.peers.http_call`)."""
    await get_after(url, seconds, aio_inflight)


aio_settings = {
    "queue": RedisQueue(
        redis.asyncio.from_url(url(), max_connections=AIO_MAX_CONNECTIONS), name=AIO_QUEUE
    ),
    "functions": [await_sleep, await_http],
    "concurrency": int(os.environ.get("BENCH_AIO_CONCURRENCY", "10")),
}
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
