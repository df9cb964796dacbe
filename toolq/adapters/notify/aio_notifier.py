"""``tq.aio``'s notifier: one task per event loop (redis.asyncio connections belong to
the loop they were made on), no thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from toolq.adapters.notify.aio_subscription import AsyncSubscription
from toolq.adapters.notify.dispatch import Dispatch
from toolq.adapters.notify.format import Event

log = logging.getLogger("toolq.notify")

#: Events a waiter holds before it gives up on them and reads the record instead
#: (a watcher that stopped consuming must not grow without bound).
WAITER_BACKLOG = 1000
#: Notices the async subscriber dispatches before it lets the loop run: a burst of
#: 1,000 settled calls would otherwise be read, and their waiters woken, in one
#: pass of the loop (tens of ms with nothing else running; bench/aio_bench.py).
DISPATCH_PER_PASS = 4


class Waiter:
    """One ``tq.aio`` wait or watch: the events heard for its ref since it last looked.

    Small on purpose, since thousands can be pending on one loop: a list and a
    future made only while it sleeps (no asyncio.Event, whose deque alone is
    larger than the rest).
    """

    __slots__ = ("_items", "_reread", "_wakeup", "progress")

    def __init__(self, progress: bool) -> None:
        self._items: list[Event] = []
        self._reread = False
        self._wakeup: asyncio.Future[None] | None = None
        #: Whether progress events are kept (a wait without on_progress drops them).
        self.progress = progress

    def put(self, event: Event | None) -> None:
        if event is None or len(self._items) >= WAITER_BACKLOG:
            self._items = []
            self._reread = True
        elif event.kind == "progress" and not self.progress:
            return
        else:
            self._items.append(event)
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """Until something was heard (True) or ``timeout`` seconds passed (False)."""
        if self._items or self._reread:
            return True
        self._wakeup = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._wakeup
        except TimeoutError:
            return False
        finally:
            self._wakeup = None
        return True

    @property
    def asleep(self) -> bool:
        return self._wakeup is not None

    def take(self) -> tuple[list[Event], bool]:
        """The events heard, oldest first, and whether the record must be read (some lost)."""
        items, reread = self._items, self._reread
        self._items = []
        self._reread = False
        return items, reread


class AsyncNotifier:
    """``tq.aio``'s subscription on one event loop: one task, shared by every waiter on it.

    It holds one connection (a Cluster: one per primary, ``client`` being a
    ``redis.asyncio.cluster.RedisCluster`` and ``subscription``
    ``AsyncShardedSubscription``), subscribed to ``channel`` (settled states) from
    the first watch on, and to ``steps_channel`` (every other state, and progress)
    from the first watch that wants those.
    """

    def __init__(
        self,
        client: aioredis.Redis | AsyncRedisCluster,
        channel: str | Sequence[str],
        steps_channel: str | Sequence[str],
        *,
        subscription: type[AsyncSubscription] = AsyncSubscription,
    ) -> None:
        self.client = client
        #: One channel of each kind, or one per ledger cell (cells mode).
        self.channels = (channel,) if isinstance(channel, str) else tuple(channel)
        self.steps_channels = (
            (steps_channel,) if isinstance(steps_channel, str) else tuple(steps_channel)
        )
        self.subscription = subscription
        self._dispatch: Dispatch[Waiter] = Dispatch(self.channels, self.steps_channels)
        self._ready = asyncio.Event()
        self._steps_ready = asyncio.Event()
        self._want_steps = False
        self._sub: AsyncSubscription | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def subscriptions(self) -> int:
        """Confirmed subscriptions to ``channel``: the first, then one per re-subscription."""
        return self._dispatch.settled.count

    async def watch(self, ref: str, *, progress: bool = False) -> Waiter:
        """Register interest in ``ref`` (with every state and progress: ``progress``).

        Returns once the subscription is confirmed: the caller reads the record
        next, and a notice published before the subscription would be missed.
        Bounded: if the server is away, the read says so.
        """
        w = Waiter(progress)
        self._dispatch.add(ref, w)
        if self._task is None or self._task.done():
            self._ready.clear()
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="toolq-aio-notify")
        try:
            if progress:
                self._want_steps = True
                await self._subscribe_steps()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._ready.wait()
                    if progress:
                        await self._steps_ready.wait()
        except BaseException:  # cancelled meanwhile: the caller never got the waiter
            self.unwatch(ref, w)
            raise
        return w

    def unwatch(self, ref: str, w: Waiter) -> None:
        self._dispatch.discard(ref, w)

    def watching(self) -> int:
        return self._dispatch.count()

    def watched(self) -> list[str]:
        """The refs somebody waits for (for tests and measurements)."""
        return list(self._dispatch.by_ref)

    def sleeping(self) -> int:
        """Waiters parked until a notice (their first read done), for measurements."""
        return sum(w.asleep for waiters in self._dispatch.by_ref.values() for w in waiters)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _subscribe_steps(self) -> None:
        """Add the steps channels to the subscription (once: it keeps them)."""
        sub = self._sub
        if sub is None:
            return  # not started: the subscription starts with them
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, OSError):
            await sub.add(*self.steps_channels)  # else subscribed with the next placing
        _cancelled_meanwhile()

    async def _run(self) -> None:
        pause = 0.1
        channels = (*self.channels, *self.steps_channels) if self._want_steps else self.channels
        sub = self._sub = self.subscription(self.client, channels)
        try:
            heard = 0
            while True:
                try:
                    msg = await sub.get_message(timeout=30.0)  # may send a health check
                    _cancelled_meanwhile()
                    if msg is None:
                        continue
                    self._heard(msg)
                    pause = 0.1
                    heard += 1
                    if heard % DISPATCH_PER_PASS == 0:
                        # Buffered notices are read without the loop getting a turn:
                        # let it run (and the waiters just woken) between batches.
                        await asyncio.sleep(0)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    log.debug("notification subscription lost; subscribing again")
                    self._ready.set()  # watchers read (and fail) rather than wait for it
                    self._steps_ready.set()
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
        finally:
            self._sub = None
            await sub.aclose()

    def _heard(self, msg: dict[str, Any]) -> None:
        group = self._dispatch.heard(msg)
        if group is not None and group.ready:
            (self._steps_ready if group is self._dispatch.steps else self._ready).set()


def _cancelled_meanwhile() -> None:
    """Raise the cancellation of the current task that a redis-py send swallowed
    (Python 3.11's asyncio.wait_for; see toolq.adapters.ledger.aio.AsyncLedger._command)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
