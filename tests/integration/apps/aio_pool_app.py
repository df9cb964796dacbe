"""An app for ``tests/integration/test_aio_pool.py``: the asyncio pool (``-P asyncio``).

Its ``async def`` tools reach the provider stub (the same Redis) with ``redis.asyncio``,
one client per event loop. ``await_slowly`` counts the calls in flight inside the tool
(``provider:inflight``) and keeps the most it saw (``provider:inflight:max``);
``awrite`` is a write with modes (ok, rate limited twice, lost reply, long sleep) and
an async verifier; ``sync_read`` is a ``def`` tool (the pool's threads run it), and
``sync_counted`` a ``def`` one that counts itself in flight as ``await_slowly`` does.
With ``AIO_POOL_APP_TASK_SIGNAL`` set in a worker's environment, a ``task_success``
receiver writes the name of the thread Celery's tracer ran it on (``provider:signal:threads``).
``gc_threshold`` returns the garbage collector's first threshold in the worker process.
``hold_loop`` holds the worker's event loop (as a tool that blocks it would) while the
calls delivered meanwhile wait for the loop's ledger connections.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref
from typing import Any

import redis
import redis.asyncio as aioredis
from celery import signals
from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

settings = ToolqSettings(
    # Longer than the other apps' 1.5 s: 200 calls starting at once on a loaded 2-CPU box
    # stall the loop up to ~1 s (a lease covers three renewals).
    lease=LeaseSettings(seconds=4.0),
    recovery=RecoverySettings(unclaimed_after=3.0, approval_timeout=60, input_timeout=60),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
)
tq = ToolQueue(settings=settings)

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
    weakref.WeakKeyDictionary()
)

#: Counts the calls in flight and keeps the most seen, in one step.
_ENTER = """
local n = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n) end
return n
"""


def provider() -> aioredis.Redis:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        pool = aioredis.BlockingConnectionPool.from_url(tq.redis_url, max_connections=64)
        client = _clients[loop] = aioredis.Redis(connection_pool=pool)
    return client


class Wait(BaseModel):
    seconds: float = 2.0
    #: Stay inside the tool until this many calls were in flight at once (or ``seconds``
    #: passed): a test then asserts the most in flight, not a time.
    until: int = 0


@tq.tool(writes=False, max_attempts=1)
async def await_slowly(args: Wait, ctx: CallContext) -> dict[str, Any]:
    p = provider()
    await p.eval(_ENTER, 2, "provider:inflight", "provider:inflight:max")
    try:
        deadline = time.monotonic() + args.seconds
        await asyncio.sleep(min(args.seconds, 0.5))
        while args.until and time.monotonic() < deadline:
            if int(await p.get("provider:inflight:max") or 0) >= args.until:
                break
            await asyncio.sleep(0.1)
    finally:
        await p.decr("provider:inflight")
    return {"pid": os.getpid(), "thread": threading.get_ident()}


class Write(BaseModel):
    mode: str = "ok"
    sleep: float = 0.0


@tq.tool(writes=True, consistency_window=0.5, max_attempts=5, verify_checks=3, verify_backoff=0.1)
async def awrite(args: Write, ctx: CallContext) -> dict[str, Any]:
    p = provider()
    ref = ctx.operation_ref
    await p.rpush(f"provider:seen:{ref}", f"{ctx.attempt}:{time.time()}")
    if args.mode == "rate_limited" and ctx.attempt < 3:
        raise errors.RateLimited("slow down", retry_after=0.2)
    async with p.pipeline(transaction=True) as pipe:
        pipe.rpush("provider:effects", ref)
        pipe.set(f"provider:committed:{ref}", "1")
        await pipe.execute()
    if args.sleep:
        await asyncio.sleep(args.sleep)  # committed, still inside the tool
    if args.mode == "lost_reply":
        raise ConnectionResetError("connection reset by peer")
    return {"paid": ref, "attempt": ctx.attempt}


@awrite.verifier
async def afind(ctx: CallContext) -> dict[str, Any] | None:
    p = provider()
    await p.incr(f"provider:lookups:{ctx.operation_ref}")
    if await p.get(f"provider:committed:{ctx.operation_ref}"):
        return {"paid": ctx.operation_ref, "found": True}
    return None


@tq.tool(writes=True, requires_approval=True)
async def aapproved(args: Write, ctx: CallContext) -> dict[str, Any]:
    await provider().rpush("provider:effects", ctx.operation_ref)
    return {"paid": ctx.operation_ref}


@tq.tool(writes=False, max_attempts=1)
async def gc_threshold(args: Wait, ctx: CallContext) -> dict[str, Any]:
    return {"first": gc.get_threshold()[0]}


@tq.tool(writes=False, max_attempts=1)
def sync_read(args: Wait, ctx: CallContext) -> dict[str, Any]:
    time.sleep(args.seconds)
    return {"thread": threading.current_thread().name}


class Hold(BaseModel):
    #: How long the loop is held once the calls wait for a ledger connection: longer
    #: than a pool's wait for one (redis-py's default, and toolq's before, 20 s).
    seconds: float = 22.0


@tq.tool(writes=False, max_attempts=1)
async def hold_loop(args: Hold, ctx: CallContext) -> dict[str, Any]:
    """Holds the loop until the test set ``hold:go`` (the calls to wait are delivered
    then), lets those calls start (each up to its wait for one of the loop's ledger
    connections, 32 at most in use), then holds the loop ``seconds`` more."""
    sync = redis.Redis.from_url(tq.redis_url)
    try:
        sync.set("hold:in", "1")
        while not sync.exists("hold:go"):  # the loop held: deliveries queue for it
            time.sleep(0.05)
    finally:
        sync.close()
    time.sleep(1.0)  # the consumer hands the last of them to the pool
    await asyncio.sleep(0)  # their tasks are made ...
    await asyncio.sleep(0)  # ... and run up to their first wait, before this goes on
    time.sleep(args.seconds)
    return {"held": args.seconds}


_sync_client: redis.Redis | None = None


def sync_provider() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(tq.redis_url)
    return _sync_client


@tq.tool(writes=False, max_attempts=1)
def sync_counted(args: Wait, ctx: CallContext) -> dict[str, Any]:
    """``await_slowly``'s count, blocking a pool thread (``provider:sync:inflight``)."""
    p = sync_provider()
    p.eval(_ENTER, 2, "provider:sync:inflight", "provider:sync:inflight:max")
    try:
        deadline = time.monotonic() + args.seconds
        while args.until and time.monotonic() < deadline:
            if int(p.get("provider:sync:inflight:max") or 0) >= args.until:
                break
            time.sleep(0.05)
    finally:
        p.decr("provider:sync:inflight")
    return {"thread": threading.current_thread().name}


def _note_tracer_thread(sender: Any = None, **_: Any) -> None:
    sync_provider().rpush("provider:signal:threads", threading.current_thread().name)


if os.environ.get("AIO_POOL_APP_TASK_SIGNAL"):
    signals.task_success.connect(_note_tracer_thread, weak=False)

celery_app = tq.celery
