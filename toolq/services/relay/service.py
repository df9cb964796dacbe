"""The relay service: moves the ledger's outbox to the Celery broker.

In outbox mode (``broker_url`` set) a transition appends its Celery message to
the outbox stream (:attr:`toolq.core.keys.Keys.outbox`) in the script that makes
it, so the transition and the intent to publish are one atomic step. A relay:

1. reads a batch in the consumer group :data:`toolq.core.keys.OUTBOX_GROUP`
   (``XREADGROUP``, blocking while the stream is empty: no polling tick);
2. publishes each message with kombu, to any broker kombu serves (on RabbitMQ
   with publisher confirms: a publish returns once the broker has it);
3. acknowledges and deletes the batch (``XACK`` + ``XDEL``, one transaction).

A relay that dies between 1 and 3 leaves its entries pending in the group:
another takes them over once they have been idle ``relay.claim_after``
(``XAUTOCLAIM``) and publishes them again. Publishing is therefore at least
once; a second copy of a message is refused by the ledger's claim (the
attempt is claimed once), so nothing runs twice. Several relays may run: the
group hands each entry to one of them.

Every cell has its outbox (:meth:`toolq.core.layout.Layout.outbox_streams`). How they are
read, waited on and acknowledged depends on the nodes, one class per mode picked by
the topology (:func:`toolq.topology.listen.outbox_reader`): on one server one
blocking ``XREADGROUP`` of every stream; on a Cluster a read per cell of those whose
notices were heard, every cell now and then.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis

from toolq.adapters.outage import UNREACHABLE
from toolq.core import errors
from toolq.core.keys import OUTBOX_GROUP
from toolq.core.text import as_text
from toolq.process.waiting import Outage, Waiter
from toolq.services.parts import Parts as Parts  # what the relay runs on
from toolq.services.relay.brokers import BrokerUnavailable, broker_errors, publisher_for
from toolq.services.relay.outgoing import Outgoing, lag_ms, outgoing
from toolq.topology.listen import FULL_READ_S, OutboxReader, outbox_reader

log = logging.getLogger("toolq.relay")

#: How often a relay records its heartbeat and numbers (toolq status reads them).
BEAT_EVERY_S = 2.0
#: What a relay round fails with when the ledger's server (a Cluster's node) is away.
LEDGER_DOWN: tuple[type[BaseException], ...] = UNREACHABLE
#: Beats older than this (relays killed without a goodbye) are removed, now and then.
FORGET_BEAT_MS = 3_600_000
FORGET_EVERY_S = 60.0
__all__ = ["FULL_READ_S", "BrokerUnavailable", "Relay"]

#: A batch: (stream, entry id, message) of each entry read.
Entry = tuple[str, str, Outgoing | None]

Hook = Callable[[Sequence[Outgoing]], None]


class Relay:
    """One relay process's loop (:meth:`run`, :meth:`stop`); :meth:`step` is one round.

    ``on_read`` and ``on_published`` are called with each batch after it is read
    and after it is published (before it is acknowledged): what a test uses to
    kill a relay at either point.
    """

    def __init__(
        self,
        app: Parts,
        *,
        on_read: Hook | None = None,
        on_published: Hook | None = None,
    ) -> None:
        settings = app.settings
        topology = app.topology
        if not topology.needs_relay:
            raise ValueError("the relay needs a broker URL: set TOOLQ_BROKER_URL (outbox mode)")
        self.app = app
        self.clock = app.clock
        self.keys = topology.layout.root
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        #: The outbox streams: one per cell (the ledger's alone with a single tag).
        self.outboxes = topology.layout.outbox_streams()
        self.broker_url = str(topology.broker(None))
        r = settings.relay
        self.batch = r.batch
        self.block_ms = int(r.block * 1000)
        self.claim_after_ms = int(r.claim_after * 1000)
        self.on_read = on_read
        self.on_published = on_published
        self.published = 0
        self.lag_ms = 0
        #: Publishes to the broker: a Redis one directly, any other through kombu.
        self.publisher = publisher_for(
            self.broker_url, settings.sentinel, settings.broker_master_name
        )
        self._topology = topology
        # Entries read and not acknowledged (a failed publish): read again before new ones.
        self._backlog = True
        self._next_autoclaim = 0.0
        self._last_beat = 0.0
        self._last_forget = 0.0
        self._broker_errors = broker_errors(self.broker_url)
        #: The waits for each dependency, and for a round that failed unexpectedly:
        #: one log line when each starts and ends; the broker's shows in the beat.
        self._stop = threading.Event()
        self.ledger_wait = Waiter(
            Outage("the ledger's server", "ledger"), log, clock=self.clock, stop=self._stop
        )
        self.broker_wait = Waiter(
            Outage("the broker", "broker"), log, clock=self.clock, stop=self._stop
        )
        self.fault_wait = Waiter(
            Outage("relay rounds", "fault", down="failing"), log, clock=self.clock, stop=self._stop
        )

    @functools.cached_property
    def reader(self) -> OutboxReader:
        """How the outboxes are read, waited on and acknowledged on these nodes."""
        app = self.app
        return outbox_reader(
            self._topology, client=app.redis, redis_url=app.redis_url, consumer=self.id
        )

    # ------------------------------------------------------------------ one round

    def setup(self) -> None:
        """Create the consumer group (and the stream) of each outbox if no relay has yet.
        First, the number of cells is checked against the ledger's (errors.RequestRefused:
        a relay without TOOLQ_CELLS on a ledger moved into cells would read no outbox)."""
        if not self.app.ledger.cells_checked:
            self.app.ledger.record_cells()
        pipe = self.app.redis.pipeline(transaction=False)
        for stream in self.outboxes:
            pipe.xgroup_create(stream, OUTBOX_GROUP, id="0", mkstream=True)
        for answer in pipe.execute(raise_on_error=False):
            if isinstance(answer, redis.ResponseError) and "BUSYGROUP" not in str(answer):
                raise answer

    def step(self, block: bool = True) -> int:
        """Take a batch (taken over, left from before, or new), publish it, acknowledge
        it; returns how many entries it moved."""
        entries = self._take(block)
        if not entries:
            self.lag_ms = 0  # nothing waits: an idle relay is not behind
            if block:  # a Cluster: no blocking read across slots, wait for a notice
                self.reader.idle(self.block_ms / 1000)
            return 0
        ids = [e for _, e, _ in entries]
        messages = [m for _, _, m in entries if m is not None]
        if self.on_read is not None:
            self.on_read(messages)
        self._publish(messages)
        if self.on_published is not None:
            self.on_published(messages)
        self._ack(entries)
        self.published += len(messages)
        self.lag_ms = lag_ms(ids, int(self.clock() * 1000))
        return len(ids)

    def _take(self, block: bool) -> list[Entry]:
        now = time.monotonic()
        if now >= self._next_autoclaim:
            # A dead relay's entries first: they are the oldest.
            self._next_autoclaim = now + min(self.claim_after_ms / 2000, 5.0)
            taken = self._autoclaim()
            if taken:
                return taken
        if self._backlog:  # this relay's own pending entries (ID 0: its history)
            rows = self._read("0", block=False)
            if rows:
                return rows
            self._backlog = False
        return self._read(">", block)

    def _autoclaim(self) -> list[Entry]:
        rows: list[Entry] = []
        for stream in self.outboxes:
            reply = self.app.redis.xautoclaim(
                stream, OUTBOX_GROUP, self.id, self.claim_after_ms, "0-0", count=self.batch
            )
            taken = _entries(stream, reply[1])
            if len(taken) >= self.batch:
                self._next_autoclaim = 0.0  # more may be left: look again next round
            rows += taken
        if rows:
            log.warning("took over %d outbox entries of a relay that stopped", len(rows))
        return rows

    def _read(self, last: str, block: bool) -> list[Entry]:
        pairs = self.reader.read(last, self.batch, self.block_ms if block else None)
        return [row for stream, raw in pairs for row in _entries(stream, raw)]

    def _publish(self, messages: Sequence[Outgoing]) -> None:
        self.publisher.publish(messages)
        self.broker_wait.answered()

    def _ack(self, entries: Sequence[Entry]) -> None:
        by_stream: dict[str, list[str]] = {}
        for stream, eid, _ in entries:
            by_stream.setdefault(stream, []).append(eid)
        self.reader.ack(by_stream)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Run until :meth:`stop`. Never ends on its own: the ledger's server or the
        broker away (for any time), or a round failing unexpectedly, is waited out
        with a capped backoff (:mod:`toolq.process.waiting`), one log line when each wait
        starts and one when it ends."""
        log.info("relay %s publishing the outbox to %s", self.id, self.app.settings.safe_broker_url)
        while not self._stop.is_set():
            try:
                self.setup()
                while not self._stop.is_set():
                    self.step()
                    self.ledger_wait.answered()
                    self.fault_wait.answered()
                    self._beat()
            except LEDGER_DOWN as exc:
                self.reader.drop()  # subscribed again, and everything read, next round
                self.ledger_wait.failed(exc)
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    # The stream went away (a flush, a restore): made again with its group.
                    log.warning("the outbox's consumer group is gone; creating it again")
                else:
                    self._fault(exc)
            except self._broker_errors as exc:
                # The entries read stay pending with this relay: published on the next round.
                self._drop_broker()
                self._backlog = True
                self._waiting_beat()
                self.broker_wait.failed(exc)
            except errors.RequestRefused:
                raise  # a misconfiguration (cells not the ledger's): said, not waited out
            except Exception as exc:
                self._fault(exc)
        log.info("relay %s stopped", self.id)

    def _fault(self, exc: Exception) -> None:
        """An unexpected error in a round: logged once with its traceback, then the
        round is tried again (with the broker's connection afresh) after a backoff."""
        self.reader.drop()
        self._drop_broker()
        self._backlog = True
        self.fault_wait.failed(exc, traceback=True)

    def _waiting_beat(self) -> None:
        """Say in the beat, now, what this relay waits for (the ledger may be away too)."""
        self._last_beat = 0.0
        try:
            self._beat()
        except redis.RedisError:
            log.debug("beat not written", exc_info=True)

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < BEAT_EVERY_S:
            return
        self._last_beat = now
        at = int(self.clock() * 1000)
        beat: dict[str, Any] = {"at": at, "published": self.published, "lag_ms": self.lag_ms}
        waiting = self.broker_wait.outage.beat()
        if waiting is not None:  # toolq status: "waiting for the broker since ..."
            beat["waiting"] = waiting
        self.app.redis.hset(self.keys.relays, self.id, json.dumps(beat))
        if now - self._last_forget >= FORGET_EVERY_S:
            self._last_forget = now
            self._forget_dead(at)

    def _forget_dead(self, now_ms: int) -> None:
        stale = []
        for rid, raw in self.app.redis.hgetall(self.keys.relays).items():
            try:
                if now_ms - int(json.loads(raw)["at"]) > FORGET_BEAT_MS:
                    stale.append(rid)
            except (ValueError, KeyError, TypeError):
                stale.append(rid)
        if stale:
            self.app.redis.hdel(self.keys.relays, *stale)
        # Each relay process joins the group under a name of its own: forget the
        # names of those gone long ago that hold nothing (what they held is taken over).
        for stream in self.outboxes:
            try:
                consumers: Any = self.app.redis.xinfo_consumers(stream, OUTBOX_GROUP)
            except redis.ResponseError:  # no group (yet)
                continue
            for c in consumers:
                name = as_text(c.get("name", ""))
                gone = int(c.get("pending", 0)) == 0 and int(c.get("idle", 0)) > FORGET_BEAT_MS
                if gone and name != self.id:
                    self.app.redis.xgroup_delconsumer(stream, OUTBOX_GROUP, name)

    def stop(self) -> None:
        """Stop after the current round (a blocked read returns within ``relay.block``)."""
        self._stop.set()

    def _drop_broker(self) -> None:
        self.publisher.close()

    def close(self) -> None:
        self._drop_broker()
        try:
            self.app.redis.hdel(self.keys.relays, self.id)
        except redis.RedisError:
            log.debug("could not remove the relay's heartbeat", exc_info=True)
        if "reader" in self.__dict__:  # built: its connections
            self.reader.close()


def _entries(stream: str, raw: Any) -> list[Entry]:
    """Stream entries as (stream, id, message); a message is None when the entry holds none."""
    out: list[Entry] = []
    for entry_id, fields in raw or ():
        eid = as_text(entry_id)
        decoded = {as_text(k): as_text(v) for k, v in (fields or {}).items()}
        message = outgoing(eid, decoded)
        if message is None:
            log.error("outbox entry %s holds no message; dropped", eid)
        out.append((stream, eid, message))
    return out
