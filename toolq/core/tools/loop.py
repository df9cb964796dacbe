"""Async tools: a coroutine is run to its end on the calling thread's own event
loop (:func:`thread_loop`), so a worker thread or a prefork child awaits async tools
without starting a loop per call."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import weakref
from typing import Any

log = logging.getLogger("toolq.registry")

_local = threading.local()
#: Loops a forked child inherited from its parent's thread. Never closed nor
#: collected here: closing one would unregister the parent's descriptors from
#: the epoll instance both processes share.
_inherited: list[asyncio.AbstractEventLoop] = []


class _ThreadLoop:
    """One thread's event loop, closed when the thread's locals go (thread exit) or at exit."""

    __slots__ = ("__weakref__", "closer", "loop", "pid")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.closer = weakref.finalize(self, _close_loop, self.loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    if loop.is_closed() or loop.is_running():
        return
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # a thread that is ending, or another loop running here: close anyway
        log.debug("async generators of a tool loop not shut down", exc_info=True)
    finally:
        loop.close()


def thread_loop() -> asyncio.AbstractEventLoop:
    """The calling thread's event loop for async tools: made on first use, then reused.

    Reused so that clients a tool keeps per loop (an httpx or redis.asyncio
    pool) survive between calls. A forked child makes its own.
    """
    owned: _ThreadLoop | None = getattr(_local, "owned", None)
    if owned is not None and owned.pid != os.getpid():
        owned.closer.detach()
        _inherited.append(owned.loop)
        owned = None
    if owned is None or owned.loop.is_closed():
        owned = _local.owned = _ThreadLoop()
    return owned.loop


def run_sync(value: Any, what: str) -> Any:
    """``value``, or what it resolves to when it is awaitable (an ``async def``'s coroutine)."""
    if not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        if inspect.iscoroutine(value):
            value.close()  # never awaited, on purpose: no warning for it
        raise RuntimeError(
            f"{what} is async and was invoked from a running event loop; await it there instead"
        )
    loop = thread_loop()
    task = asyncio.ensure_future(value, loop=loop)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        # Interrupted from outside (a signal, a soft time limit): let the tool's
        # coroutine unwind now, not inside the next call on this loop.
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):  # the first exception is the one to raise
                loop.run_until_complete(task)
        raise
