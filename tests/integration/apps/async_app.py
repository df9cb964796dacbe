"""An app of ``async def`` tools for ``tests/integration/test_async_tools.py``.

The provider stub lives in the same Redis and is reached with ``redis.asyncio``,
one client per event loop, as an async tool would keep its HTTP or database
client. It records every side effect (``provider:effects``), every ref it was
sent (``provider:seen:<ref>``), each lookup (``provider:lookups:<ref>``) and,
per call, the process, thread and loop that ran it (``provider:loops``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
import weakref
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

settings = ToolqSettings(
    lease=LeaseSettings(seconds=1.5),
    recovery=RecoverySettings(unclaimed_after=3.0, approval_timeout=60, input_timeout=60),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
)
tq = ToolQueue(settings=settings)

# A redis.asyncio client is bound to the loop it connected on: one per loop.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
    weakref.WeakKeyDictionary()
)


def provider() -> aioredis.Redis:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = aioredis.Redis.from_url(tq.redis_url)
    return client


async def where(ref: str) -> None:
    """Record which process, thread and event loop served this call.

    A loop is named by a token set on it, not by ``id()``: a loop made per call
    could reuse the address of the one before it.
    """
    loop: Any = asyncio.get_running_loop()
    if not hasattr(loop, "test_token"):
        loop.test_token = uuid.uuid4().hex
    row = f"{ref}|{os.getpid()}:{threading.get_ident()}|{loop.test_token}"
    await provider().rpush("provider:loops", row)


class Pay(BaseModel):
    mode: str = "ok"


@tq.tool(writes=True, consistency_window=0.5, max_attempts=3, verify_checks=3, verify_backoff=0.1)
async def apay(args: Pay, ctx: CallContext) -> dict[str, Any]:
    p = provider()
    await where(ctx.operation_ref)
    await p.rpush(f"provider:seen:{ctx.operation_ref}", f"{ctx.attempt}:{time.time()}")
    await asyncio.sleep(0.01)  # a real suspension: the coroutine runs on the loop
    async with p.pipeline(transaction=True) as pipe:  # one commit (runtime_app says why)
        pipe.rpush("provider:effects", ctx.operation_ref)
        pipe.set(f"provider:committed:{ctx.operation_ref}", "1")
        await pipe.execute()
    if args.mode == "lost_reply":  # committed, but the reply never arrives
        raise ConnectionResetError("connection reset by peer")
    return {"paid": ctx.operation_ref, "attempt": ctx.attempt}


@apay.verifier
async def afind_payment(ctx: CallContext) -> dict[str, Any] | None:
    p = provider()
    await where(ctx.operation_ref)
    await p.incr(f"provider:lookups:{ctx.operation_ref}")
    if await p.get(f"provider:committed:{ctx.operation_ref}"):
        return {"paid": ctx.operation_ref, "found": True}
    return None


celery_app = tq.celery
