"""The tools of ``bench/aio_pool_bench.py`` (issue 29): slow I/O on the asyncio pool.

``await_sleep`` awaits ``seconds``; ``await_http`` awaits a local HTTP provider that
answers after ``seconds`` (``httpx.AsyncClient``, one per event loop); both count the
calls inside the tool (``bench:inflight``) and keep the most seen (``bench:inflight:max``).
``sleep100`` (a ``def`` tool, 100 ms) is :mod:`bench.apps`' I/O-bound tool.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from typing import Any

import httpx
import redis.asyncio as aioredis
from pydantic import BaseModel

from toolq import ToolQueue

tq = ToolQueue(name="bench")
#: For ``celery -A bench.aio_pool_app:celery_app worker`` (the threads pool past -c 1024).
celery_app = tq.celery

_ENTER = """
local n = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n) end
return n
"""

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def _loop_clients() -> tuple[aioredis.Redis, httpx.AsyncClient]:
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=4096)
        found = _clients[loop] = (
            aioredis.Redis(
                connection_pool=aioredis.BlockingConnectionPool.from_url(
                    tq.redis_url, max_connections=64
                )
            ),
            httpx.AsyncClient(limits=limits, timeout=120),
        )
    return found


class Wait(BaseModel):
    seconds: float = 10.0
    url: str = ""


async def _counted(r: aioredis.Redis, wait: Any) -> None:
    await r.eval(_ENTER, 2, "bench:inflight", "bench:inflight:max")
    try:
        await wait
    finally:
        await r.decr("bench:inflight")


@tq.tool(writes=False, max_attempts=1)
async def await_sleep(args: Wait) -> dict[str, Any]:
    r, _ = _loop_clients()
    await _counted(r, asyncio.sleep(args.seconds))
    return {}


@tq.tool(writes=False, max_attempts=1)
async def await_http(args: Wait) -> dict[str, Any]:
    r, http = _loop_clients()
    await _counted(r, http.get(f"{args.url}?s={args.seconds}"))
    return {}


@tq.tool(writes=False, max_attempts=1)
def sleep100(args: Wait) -> dict[str, Any]:
    time.sleep(0.1)
    return {"pid": os.getpid()}
