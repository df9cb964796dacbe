"""How many messages a broker's queue holds, on any kombu transport.

A passive ``queue_declare`` answers with the queue's ready messages on RabbitMQ
(those delivered to a worker and not yet acknowledged are not counted) and
with its list's length on Redis. The scheduler asks in outbox mode, where the
queues are not the ledger's to read (:func:`toolq.recovery.policy.on_its_way`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kombu import Connection

log = logging.getLogger("toolq.broker")


class Depths:
    """Reads queue depths on one broker connection, made on first use and again after
    a failure. Not thread-safe: one per scheduler."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self.url = url
        self.timeout = timeout
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
                conn = self._conn = Connection(self.url, connect_timeout=self.timeout)
            with conn.channel() as channel:
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
