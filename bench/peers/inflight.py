"""The peers' side of the asyncio-pool bench's in-flight count (issue 29,
:mod:`bench.aio_pool_bench`): the calls inside the function in the worker process,
counted in its memory, the most seen and how many ended published to Redis by a
thread of its own, as :class:`bench.aio_pool_app.InFlight` does for toolq's worker.

Imported by saq's worker (toolq's venv) and by arq's (``.venv-arq``, redis-py 5):
the standard library and redis-py only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis

#: The same key as toolq's (``bench.aio_pool_app.MAX_KEY``); the server is flushed per run.
MAX_KEY = "bench:inflight:max"
#: How many calls left the function (the bench waits on it before reading the records).
DONE_KEY = "bench:inflight:done"
PUBLISH_EVERY_S = 0.1


class InFlight:
    """``url``: the server's, or a function giving it when the first call enters (an
    app configured after import: toolq's, :mod:`bench.aio_pool_app`)."""

    def __init__(self, url: str | Callable[[], str]) -> None:
        self.url = url
        self.now = 0
        self.most = 0
        self.done = 0
        self._lock = threading.Lock()
        self._publisher: threading.Thread | None = None

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            if self._publisher is None:
                self._publisher = threading.Thread(
                    target=self._publish, name="bench-inflight", daemon=True
                )
                self._publisher.start()

    def leave(self) -> None:
        with self._lock:
            self.now -= 1
            self.done += 1

    async def counted(self, wait: Awaitable[Any]) -> None:
        """Await ``wait`` counted in flight."""
        self.enter()
        try:
            await wait
        finally:
            self.leave()

    def _publish(self) -> None:
        r = redis.Redis.from_url(self.url() if callable(self.url) else self.url)
        sent = (0, 0)
        while True:
            now = (self.most, self.done)
            if now != sent:
                with contextlib.suppress(redis.RedisError):
                    r.mset({MAX_KEY: now[0], DONE_KEY: now[1]})
                    sent = now
            time.sleep(PUBLISH_EVERY_S)
