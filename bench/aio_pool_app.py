"""The tools of ``bench/aio_pool_bench.py`` (issue 29): slow I/O on the asyncio pool.

``await_sleep`` awaits ``seconds``; ``await_http`` awaits a local HTTP provider that
answers after ``seconds`` (an ``httpx.AsyncClient`` per call, sharing one SSL context:
:mod:`bench.peers.http_call`, saq's and arq's tool body too); both
count the calls inside the tool in the worker process's memory and publish the most
seen (``bench:inflight:max``, :class:`bench.peers.inflight.InFlight`).

Not one client for every call: httpx 0.28's pool (httpcore 1.0) walks every connection
on each request and, per idle connection, every connection again on each response
(``_assign_requests_to_connections``). One client holding 2,000 connections with
keep-alive held the worker's loop for minutes when the responses came back: 1,000 GETs
on a loop alone took 24 s of CPU, 24 s of it in one turn of the loop (a client per call:
1.3 s); the worker's claims waiting on that loop timed out and were requeued. Still so
in httpx 0.29 and httpx2 2.16 (its pool rewritten, the OpenAI/Anthropic/MCP SDKs' client):
one client with ``max_connections=max_keepalive_connections=2000``, 2,000 GETs of 5 s on
one loop alone sent the last request after 125 s (httpx) and 48 s (httpx2); a client per
call, after 7-17 s on a machine at load 4-6, in CPU 6.5-8 s against 70 and 25.

Where the ``http`` scenario's ~2 s past ``sleep`` go (2026-12-02, py-spy on the worker,
timestamps in the tool and the provider): httpx's CPU on the loop, ~1.3 ms a call (worker
CPU 4.4 s against 1.7 s), ~80 % of it before the request is sent (the client, its
environment proxy lookup, anyio's connect, ``get_extra_info``, the first write) and
~17 % reading and closing; the last requests leave late and their answers come back as
late. Not the provider: its sleeps end within 20 ms of due and it writes at once.
Of the worker's CPU, ~1 s went to full garbage collections as 2,000 calls grew the heap
to ~0.5 M objects (7 at CPython's threshold of 700, none at the pool's 10,000:
``worker.gc_threshold``); the loop on uvloop changed nothing (httpx's CPU is Python's).
``trust_env=False`` (no proxy lookup per client) saved ~5 % of the worker's CPU, within
the wall's noise: not taken.
``sleep100`` (a ``def`` tool, 100 ms) is :mod:`bench.apps`' I/O-bound tool.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import BaseModel

from bench.peers.http_call import get_after
from bench.peers.inflight import InFlight
from toolq import ToolQueue

tq = ToolQueue(name="bench")
#: For ``celery -A bench.aio_pool_app:celery_app worker`` (the threads pool past -c 1024).
celery_app = tq.celery

#: Calls inside a tool in this worker process, counted in its memory, the most
#: published to ``bench:inflight:max`` by a thread every 0.1 s. Counted in Redis instead
#: (an EVAL in, a DECR out, on the loop's pool), the count cost each call two round trips
#: inside the tool: with 2,000 calls ending within a second on one loop the DECRs queued
#: for up to 2.4 s, and the bench's wall was partly its own counter (bench/RESULTS.md).
inflight = InFlight(lambda: tq.redis_url)


class Wait(BaseModel):
    seconds: float = 10.0
    url: str = ""


@tq.tool(writes=False, max_attempts=1)
async def await_sleep(args: Wait) -> dict[str, Any]:
    await inflight.counted(asyncio.sleep(args.seconds))
    return {}


@tq.tool(writes=False, max_attempts=1)
async def await_http(args: Wait) -> dict[str, Any]:
    await get_after(args.url, args.seconds, inflight)
    return {}


@tq.tool(writes=False, max_attempts=1)
def sleep100(args: Wait) -> dict[str, Any]:
    time.sleep(0.1)
    return {"pid": os.getpid()}
