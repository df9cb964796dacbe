"""arq's side of the peers bench, run with arq's own venv (arq 0.28 pins redis < 6).

``python -m arq bench.peers.arq_app.WorkerSettings``: a worker (max_jobs 10, async).
``python -m bench.peers.arq_app``: the submitter, driven line by line on stdin by
:mod:`bench.peers.arq_peer` (``submit TASK START STOP`` -> ``ok``; ``wait TIMEOUT`` ->
``done FAILED``), so it never shares a process with toolq's redis-py.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

URL = os.environ.get("BENCH_PEER_URL", "redis://127.0.0.1:6379/0")
CRASH_KEY = "bench:peers:crash:arq:{n}"  # bench.peers.CRASH_KEY for arq


async def noop(ctx: dict[str, Any], n: int) -> None:
    return None


async def sleep100(ctx: dict[str, Any], n: int) -> None:
    await asyncio.sleep(0.1)


async def crash_write(ctx: dict[str, Any], n: int) -> None:
    await asyncio.sleep(0.05)
    await ctx["redis"].incr(CRASH_KEY.format(n=n))
    await asyncio.sleep(0.05)


class WorkerSettings:
    functions = [noop, sleep100, crash_write]
    redis_settings = RedisSettings.from_dsn(URL)


NAMES = {"noop": "noop", "sleep": "sleep100", "crash": "crash_write"}


async def serve() -> None:
    pool = await create_pool(RedisSettings.from_dsn(URL))
    jobs: list[Any] = []
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).split():
        if line[0] == "submit":
            task, a, b = line[1], int(line[2]), int(line[3])
            jobs = [await pool.enqueue_job(NAMES[task], i) for i in range(a, b)]
            print("ok", flush=True)
        elif line[0] == "wait":
            failed = 0
            for job in jobs:
                try:
                    # A short poll (arq's default polls every 0.5 s).
                    await job.result(timeout=float(line[1]), poll_delay=0.01)
                except Exception:
                    failed += 1
            print(f"done {failed}", flush=True)
    await pool.aclose()


if __name__ == "__main__":
    asyncio.run(serve())
