"""The "provider" the test apps write their side effects to: the test's own Redis.

One client per process: a forked pool child must not share its parent's socket.
"""

from __future__ import annotations

import os

import redis

from toolq import ToolQueue


class ProcessClient:
    """``client()`` is a Redis client on ``tq``'s server, made once per process."""

    def __init__(self, tq: ToolQueue) -> None:
        self._tq = tq
        self._client: redis.Redis | None = None
        self._pid = 0

    def __call__(self) -> redis.Redis:
        if self._client is None or self._pid != os.getpid():
            # No read timeout: redis-py's default (5 s) would end a gated tool's
            # 30 s BLPOP as an unexpected failure.
            self._client = redis.Redis.from_url(self._tq.redis_url, socket_timeout=None)
            self._pid = os.getpid()
        return self._client
