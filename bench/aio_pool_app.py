"""The tools of ``bench/aio_pool_bench.py`` (issue 29): slow I/O on the asyncio pool.

``await_sleep`` awaits ``seconds``; ``await_http`` awaits a local HTTP provider that
answers after ``seconds`` (an ``httpx.AsyncClient`` per call, sharing one SSL context); both
count the calls inside the tool (``bench:inflight``) and keep the most seen
(``bench:inflight:max``).

Not one client for every call: httpx 0.28's pool (httpcore 1.0) walks every connection
on each request and, per idle connection, every connection again on each response
(``_assign_requests_to_connections``). One client holding 2,000 connections with
keep-alive held the worker's loop for minutes when the responses came back: 1,000 GETs
on a loop alone took 24 s of CPU, 24 s of it in one turn of the loop (a client per call:
1.3 s); the worker's claims waiting on that loop timed out and were requeued.
``sleep100`` (a ``def`` tool, 100 ms) is :mod:`bench.apps`' I/O-bound tool.
"""

from __future__ import annotations

import asyncio
import os
import ssl
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

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
    weakref.WeakKeyDictionary()
)
#: Made once: a client's own would load the CA bundle at each call.
_ssl = ssl.create_default_context()


def _loop_client() -> aioredis.Redis:
    """The counters' client of this loop: its calls wait for a connection as long as
    it takes (no 20 s bound: a count must not fail the call)."""
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None:
        pool = aioredis.BlockingConnectionPool.from_url(
            tq.redis_url, max_connections=64, timeout=None
        )
        found = _clients[loop] = aioredis.Redis(connection_pool=pool)
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
    await _counted(_loop_client(), asyncio.sleep(args.seconds))
    return {}


@tq.tool(writes=False, max_attempts=1)
async def await_http(args: Wait) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=120, verify=_ssl) as http:
        await _counted(_loop_client(), http.get(f"{args.url}?s={args.seconds}"))
    return {}


@tq.tool(writes=False, max_attempts=1)
def sleep100(args: Wait) -> dict[str, Any]:
    time.sleep(0.1)
    return {"pid": os.getpid()}
