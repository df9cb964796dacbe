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
:func:`toolq.adapters.broker.app.celery_config`), and for ``sentinel://`` ones with
kombu's Sentinel channel (:data:`SENTINEL_TRANSPORT`); other schemes get
kombu's own.

**Acknowledged by the ledger.** When the broker is the ledger's server, the
ledger call that ends a delivery (a refused claim, or the record of its
outcome) acknowledges it in the same script: it removes the delivery tag from
kombu's unacked hash and index, as kombu's ack would
(:mod:`toolq.adapters.ledger.scripts`). Celery then acknowledges as always; its
:class:`toolq.adapters.broker.request.Request` marks the tag first
(:mod:`toolq.adapters.broker.ack`), and :class:`QoS` does only the local bookkeeping
for a marked tag: no round trip, the task's thread (or the prefork parent)
free at once. Measured in bench/RESULTS.md (issue 14).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from toolq.adapters.broker.ack import acked_by_ledger, take

__all__ = ["SENTINEL_TRANSPORT", "TRANSPORT", "Channel", "QoS", "Transport", "acked_by_ledger"]

#: What ``broker_transport`` names.
TRANSPORT = "toolq.adapters.broker.transport:Transport"
#: ... for a broker behind Sentinel (``sentinel://``).
SENTINEL_TRANSPORT = "toolq.adapters.broker.transport:SentinelTransport"


class QoS(kombu_redis.QoS):
    def ack(self, delivery_tag: str) -> None:
        if take(delivery_tag):
            virtual.QoS.ack(self, delivery_tag)  # forget it here; Redis has it already
            return
        super().ack(delivery_tag)


class Channel(kombu_redis.Channel):
    QoS = QoS
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


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool asks the Sentinels for the primary, again
    on every new connection: a failover is followed) with toolq's client reuse."""


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
