"""How the relay publishes to the Celery broker: one class per kind of broker, picked
once (:func:`publisher_for`).

A Redis/Valkey broker (behind Sentinel too) is written directly (:class:`RedisPush`);
any other kombu broker goes through kombu's producer (:class:`KombuPublish`, with
publisher confirms on AMQP).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import redis
import redis.sentinel
from amqp.exceptions import MessageNacked
from kombu import Connection, Producer, Queue
from kombu.exceptions import KombuError

from toolq.adapters.broker.app import is_amqp, is_redis, queue_for
from toolq.core.settings import SentinelUrl
from toolq.services.relay.outgoing import Outgoing

log = logging.getLogger("toolq.relay")


class BrokerUnavailable(OSError):
    """A Redis broker failed a push (told apart from the ledger's Redis failing)."""


def broker_errors(url: str) -> tuple[type[BaseException], ...]:
    """What a publish to the broker at ``url`` fails with while the broker is away."""
    probe = Connection(url)  # lazy: connects to nothing
    return (
        OSError,
        # kombu's own: OperationalError when Connection.default_channel cannot
        # connect (what ended every relay after ~8 s of RabbitMQ down)
        KombuError,
        MessageNacked,  # RabbitMQ refused a publish (confirm mode): publish it again
        *probe.connection_errors,
        *probe.channel_errors,
    )


class Publisher(ABC):
    """Publishes a batch of outbox messages to the broker at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url

    @abstractmethod
    def publish(self, messages: Sequence[Outgoing]) -> None:
        """Every message, or an error of :func:`broker_errors`."""

    @abstractmethod
    def close(self) -> None:
        """Drop the broker's connections (made again on the next publish)."""


class KombuPublish(Publisher):
    """Any kombu broker: ``Producer.publish`` of each message, as Celery would."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._queues: dict[str, Queue] = {}
        self.connection: Connection | None = None
        self._producer: Producer | None = None

    def publish(self, messages: Sequence[Outgoing]) -> None:
        producer = self.producer()
        for m in messages:
            queue = self._queue(m.queue)
            producer.publish(
                m.body,
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                declare=[queue],
                content_type=m.content_type,
                content_encoding=m.content_encoding,
                headers=m.headers,
                delivery_mode=2,
                retry=False,
                **m.properties,
            )

    def _queue(self, name: str) -> Queue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = queue_for(name, self.url)
        return queue

    def producer(self) -> Producer:
        if self._producer is None:
            # Publisher confirms on AMQP: publish() returns once RabbitMQ has the
            # message (a quorum queue: on a majority of its replicas).
            options: dict[str, Any] = {"confirm_publish": True} if is_amqp(self.url) else {}
            # One try to connect, then the error: run() waits and tries again itself
            # (kombu's own retries end in an error after ~8 s anyway, and grow to 30 s).
            options["max_retries"] = 0
            self.connection = Connection(self.url, transport_options=options)
            self._producer = Producer(self.connection.default_channel)
        return self._producer

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            except Exception:  # a broken connection may fail to close
                log.debug("closing the broker connection failed", exc_info=True)
        self.connection = self._producer = None


class RedisPush(Publisher):
    """A Redis broker: each message pushed to its queue list as the ledger built it,
    kombu's Redis transport's own envelope (what the scripts push without an outbox),
    the batch in one round trip. kombu's publish would look the exchange's bindings up
    (SMEMBERS) and build a client object per message: 1.8 ms of relay CPU a message,
    measured (bench/RESULTS.md, "Outbox mode")."""

    def __init__(
        self, url: str, sentinel: SentinelUrl | None = None, master_name: str | None = None
    ) -> None:
        super().__init__(url)
        self._sentinel = sentinel
        self._master_name = master_name
        self._client: redis.Redis | None = None
        self._sentinels: redis.sentinel.Sentinel | None = None

    def publish(self, messages: Sequence[Outgoing]) -> None:
        if self._client is None:
            self._client = self._connect()
        pipe = self._client.pipeline(transaction=False)
        for m in messages:
            pipe.lpush(m.queue, m.raw)
        try:
            pipe.execute()
        except redis.RedisError as exc:  # the broker's, not the ledger's: see Relay.run()
            raise BrokerUnavailable(type(exc).__name__) from exc

    def _connect(self) -> redis.Redis:
        """The Redis broker's client. Behind Sentinel, on the primary its Sentinels name:
        each new connection asks them again, and a failed push drops the client
        (:meth:`close`), so the push after a failover goes to the promoted replica.
        Until the Sentinels have promoted one they name the dead primary, or none
        (``MasterNotFoundError``): connection errors, retried as any broker's."""
        s = self._sentinel
        if s is None:
            return redis.Redis.from_url(self.url, socket_timeout=30)
        assert self._master_name is not None  # the settings refuse a sentinel URL without
        self._sentinels = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(s.sentinels), sentinel_kwargs={"socket_timeout": 5, "socket_connect_timeout": 5}
        )
        client: redis.Redis = self._sentinels.master_for(  # type: ignore[no-untyped-call]
            self._master_name,
            socket_timeout=30,
            socket_connect_timeout=5,
            username=s.username,
            password=s.password,
            db=s.db,
        )
        return client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._sentinels is not None:
            self._sentinels.close()  # its connections to each Sentinel
            self._sentinels = None


def publisher_for(url: str, sentinel: SentinelUrl | None, master_name: str | None) -> Publisher:
    """The publisher of the broker at ``url`` (``sentinel``: its Sentinels, if any)."""
    if sentinel is not None or is_redis(url):
        return RedisPush(url, sentinel, master_name)
    return KombuPublish(url)
