"""kombu's Redis transport, with one Redis client per channel instead of one per command.

kombu 5.7's ``Channel.conn_or_acquire()`` builds a new ``redis.Redis`` object
for every publish, ack and event it sends without a client at hand. With
redis-py 8 building a client costs more than the command it sends (its
response-callback table is rebuilt each time): py-spy put it at 17 % of a
threads-pool worker's CPU (task events and late acks), see bench/RESULTS.md.
The client objects all share the channel's connection pool, so one client per
pool is the same thing, built once. It also lets a closing channel give its
unacknowledged messages back after the connection is gone (see below).

Used for ``redis://`` brokers (``broker_transport`` in
:func:`toolq.broker.app.celery_config`); other schemes get kombu's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

#: What ``broker_transport`` names.
TRANSPORT = "toolq.broker.transport:Transport"


class Channel(kombu_redis.Channel):
    _toolq_client: redis.Redis | None = None
    _toolq_client_pool: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self._pool is None and self._toolq_client is not None:  # type: ignore[attr-defined]
            # Closing: the pools are gone, and kombu 5.7 would build a new one from a
            # connection already torn down (``'NoneType' object has no attribute
            # 'hostname'`` in restore_unacked, after a Redis restart: the worker then
            # exits). The last pool reconnects as well as a new one would.
            yield self._toolq_client
            return
        pool = self.pool
        if self._toolq_client is None or self._toolq_client_pool is not pool:
            # A new pool (the channel reconnected) gets a new client.
            self._toolq_client = self._create_client()  # type: ignore[attr-defined]
            self._toolq_client_pool = pool
        yield self._toolq_client


class Transport(kombu_redis.Transport):
    Channel = Channel
