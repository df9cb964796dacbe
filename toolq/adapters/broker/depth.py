"""How many messages a broker's queue holds, on any kombu transport.

A passive ``queue_declare`` answers with the queue's ready messages on RabbitMQ
(those delivered to a worker and not yet acknowledged are not counted); on
Redis (direct or behind Sentinel) its lists' length is read (an empty list does
not exist: a passive declare would call it unknown). The scheduler asks in outbox mode, where the
queues are not the ledger's to read (:func:`toolq.decisions.recovery.policy.on_its_way`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kombu import Connection
from kombu.transport import redis as kombu_redis

log = logging.getLogger("toolq.broker")


class Depths:
    """Reads queue depths on one broker connection, made on first use and again after
    a failure. Not thread-safe: one per scheduler."""

    def __init__(
        self, url: str, timeout: float = 2.0, transport_options: dict[str, Any] | None = None
    ) -> None:
        self.url = url
        self.timeout = timeout
        #: :func:`toolq.adapters.broker.app.transport_options` (a ``sentinel://`` URL needs its
        #: ``master_name``: each new connection then asks the Sentinels for the primary).
        self.transport_options = transport_options or {}
        self._conn: Connection | None = None

    def read(self, names: Iterable[str]) -> dict[str, int | None]:
        """Each queue's depth; None for one the broker did not answer for (an unknown
        queue, a broker away): the caller then assumes it may hold anything."""
        out: dict[str, int | None] = {}
        for name in names:
            # After a failure the rest are not asked: each would wait out the timeout.
            failed = bool(out) and all(v is None for v in out.values())
            out[name] = None if failed else self._one(name)
        return out

    def _one(self, name: str) -> int | None:
        conn = self._conn
        try:
            if conn is None:
                conn = self._conn = Connection(
                    self.url,
                    connect_timeout=self.timeout,
                    transport_options=self.transport_options,
                )
            with conn.channel() as channel:
                if isinstance(channel, kombu_redis.Channel):
                    # A Redis list that holds nothing does not exist: the passive declare
                    # would say "no queue" for an empty one, which the scheduler must
                    # take for "may hold anything". Its length (0) is the answer.
                    return int(channel._size(name))
                declared: Any = channel.queue_declare(queue=name, passive=True)  # type: ignore[attr-defined]
                return int(declared.message_count)
        except Exception as exc:  # any broker failure means "not known"
            log.debug("queue %s: depth unknown (%s)", name, type(exc).__name__)
            self.close()
            return None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # closing a broken connection
                log.debug("closing the broker connection failed", exc_info=True)
        self._conn = None
