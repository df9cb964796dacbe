"""The "provider" the test apps write their side effects to: the test's own Redis.

One client per process: a forked pool child must not share its parent's socket.
"""

from __future__ import annotations

import os

import redis

from toolq import ToolQueue


class ProcessClient:
    """``client()`` is a Redis client on ``tq``'s server, made once per process; on
    the server the environment variable ``url_env`` names instead, when it is set
    (a Cluster's node would answer a plain client MOVED)."""

    def __init__(self, tq: ToolQueue, url_env: str = "") -> None:
        self._tq = tq
        self._url_env = url_env
        self._client: redis.Redis | None = None
        self._pid = 0

    def __call__(self) -> redis.Redis:
        if self._client is None or self._pid != os.getpid():
            # No read timeout: redis-py's default (5 s) would end a gated tool's
            # 30 s BLPOP as an unexpected failure.
            url = (os.environ.get(self._url_env) if self._url_env else None) or self._tq.redis_url
            self._client = redis.Redis.from_url(url, socket_timeout=None)
            self._pid = os.getpid()
        return self._client
