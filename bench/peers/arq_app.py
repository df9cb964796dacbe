"""arq's side of the peers bench, run with arq's own venv (arq 0.28 pins redis < 6).

``python -m arq bench.peers.arq_app.WorkerSettings``: a worker (max_jobs 10, async);
``…arq_app.AioSettings``: the asyncio-pool bench's (``max_jobs`` from the environment).
``python -m bench.peers.arq_app``: the submitter, driven line by line on stdin by
:mod:`bench.peers.arq_peer` (``submit TASK START STOP`` -> ``ok``; ``wait TIMEOUT`` ->
``done FAILED``; for :mod:`bench.aio_pool_bench`, ``aio CALLS SECONDS [URL]`` -> ``ok`` and
``stamps TIMEOUT`` -> one JSON line), so it never shares a process with toolq's redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

from bench.peers import gc_threshold_from_env
from bench.peers.http_call import get_after
from bench.peers.inflight import InFlight

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


aio_inflight = InFlight(URL)
gc_threshold_from_env()  # a configured variant only (bench.peers.GC_THRESHOLD_ENV)


async def await_sleep(ctx: dict[str, Any], n: int, seconds: float) -> None:
    await aio_inflight.counted(asyncio.sleep(seconds))


async def await_http(ctx: dict[str, Any], n: int, seconds: float, url: str) -> None:
    """The bench's ``http`` tool body, as toolq's (:mod:`bench.peers.http_call`)."""
    await get_after(url, seconds, aio_inflight)


class AioSettings:
    """The asyncio-pool bench's (:mod:`bench.aio_pool_bench`): one worker process at
    ``max_jobs`` ``BENCH_AIO_MAX_JOBS``, arq's defaults otherwise."""

    functions = [await_sleep, await_http]
    redis_settings = RedisSettings.from_dsn(URL)
    max_jobs = int(os.environ.get("BENCH_AIO_MAX_JOBS", "10"))


NAMES = {"noop": "noop", "sleep": "sleep100", "crash": "crash_write"}


async def _stamps(jobs: list[Any], timeout: float) -> dict[str, Any]:
    """arq's stamps of each job (epoch ms): ``start_time`` is taken just before the
    function's coroutine is created, ``finish_time`` right after it returns, both before
    the result is written."""
    starts, finishes, ok = [], [], 0
    for job in jobs:
        with contextlib.suppress(Exception):
            await job.result(timeout=timeout, poll_delay=0.05)
        info = await job.result_info()
        if info is None:
            continue
        starts.append(info.start_time.timestamp() * 1000)
        finishes.append(info.finish_time.timestamp() * 1000)
        ok += bool(info.success)
    return {"starts": starts, "finishes": finishes, "succeeded": ok}


async def serve() -> None:
    pool = await create_pool(RedisSettings.from_dsn(URL))
    jobs: list[Any] = []
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).split():
        if line[0] == "submit":
            task, a, b = line[1], int(line[2]), int(line[3])
            jobs = [await pool.enqueue_job(NAMES[task], i) for i in range(a, b)]
            print("ok", flush=True)
        elif line[0] == "aio":  # aio CALLS SECONDS [URL]: await_sleep (await_http) jobs
            calls, seconds, http = int(line[1]), float(line[2]), line[3:]
            jobs = [
                await pool.enqueue_job("await_http", i, seconds, *http)
                if http
                else await pool.enqueue_job("await_sleep", i, seconds)
                for i in range(calls)
            ]
            print("ok", flush=True)
        elif line[0] == "stamps":  # stamps TIMEOUT: the jobs' own start and finish stamps
            print(json.dumps(await _stamps(jobs, float(line[1]))), flush=True)
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
