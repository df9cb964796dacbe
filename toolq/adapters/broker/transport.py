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

**Many messages per fetch** (issue 29). kombu takes one message per BRPOP and then
registers it as unacknowledged in a second round trip (``QoS.append``: ZADD to
``unacked_index``, HSET to ``unacked``); a crash between the two loses the message.
Here one script (:data:`FETCH_SCRIPT`) takes up to as many messages as the channel's
QoS can take (at most ``fetch_batch``) from one list and writes each to
``unacked``/``unacked_index`` exactly as ``QoS.append`` would (``[message, exchange,
routing_key]`` under its delivery tag, indexed by the time), in one atomic step:
kombu's restores (``restore_visible``, ``restore_unacked``, a requeue) read them back
as their own. A fetch is then one of two:

- the list had more when the last fetch took from it: the script alone, sent where
  kombu sends its BRPOP and read where kombu reads it (no BRPOP; one round trip, and
  nothing out of the lists that is not registered);
- otherwise kombu's BRPOP, which waits for a message; the script then registers that
  message and takes more from the same list (two round trips for the batch).

The messages are delivered through kombu's path one by one; :class:`QoS` does only the
local bookkeeping for a tag the script registered. The script reads before it writes
and takes from the list last, so a refusal (a full ``noeviction`` server, scripts not
allowed) leaves the list whole; then the message a BRPOP took goes kombu's own way,
and every fetch does for :data:`REFUSED_PAUSE_S`. ``fetch_batch`` (a transport option,
``worker.fetch_batch``; 0: kombu's path) bounds a fetch, and so does the QoS (never
more than the prefetch the consumer allows). Written against kombu 5.7's
``_brpop_start``/``_brpop_read`` (private; the read is a copy of 5.7's with the script
beside it): on any other kombu series the fetch is kombu's own, whatever
``fetch_batch`` says (:func:`fetch_supported`), and a worker says so once. Measured
in bench/RESULTS.md ("Many messages per fetch").

**A fetch out when the consumer reconnects.** Celery's consumer cancels its consumers
and opens a new connection; a fetch the old channel had sent is still read there, into
no consumer. Its messages go back to the head of their list with one line
(:meth:`Channel._toolq_unconsumed`), where kombu logged "Requeuing undeliverable
message for queue ...: No consumers" at WARNING for each, as if the worker consumed no
such queue.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version as _installed
from queue import Empty
from time import monotonic, time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import object_hook
from redis.exceptions import NoScriptError, ResponseError

from toolq.adapters.broker.ack import acked_by_ledger, take

#: kombu's ``loads`` (a message as the consumer reads it, kombu's types included), with
#: one decoder: ``json.loads`` with an ``object_hook`` builds a JSONDecoder every call.
loads = json.JSONDecoder(object_hook=object_hook).decode

__all__ = [
    "FETCH_BATCH",
    "FETCH_SCRIPT",
    "SENTINEL_TRANSPORT",
    "TRANSPORT",
    "Channel",
    "QoS",
    "Transport",
    "acked_by_ledger",
    "fetch_more",
    "fetch_supported",
]

log = logging.getLogger("toolq.worker")

#: What ``broker_transport`` names.
TRANSPORT = "toolq.adapters.broker.transport:Transport"
#: ... for a broker behind Sentinel (``sentinel://``).
SENTINEL_TRANSPORT = "toolq.adapters.broker.transport:SentinelTransport"

#: Messages one fetch takes at most, the BRPOP's included (``fetch_batch``'s default).
FETCH_BATCH = 64
#: The kombu series whose private BRPOP read the fetch follows.
FETCH_KOMBU = (5, 7)
#: After the server refused the script: kombu's own path for this long, then again.
REFUSED_PAUSE_S = 30.0

#: KEYS: ``unacked``, ``unacked_index``, then the lists to take from, in kombu's order
#: (a BRPOP's: each priority, each queue). ARGV: how many to take at most, the time
#: (the index's score: the client's clock, as kombu's), the message a BRPOP took ('':
#: none). Takes from the first list that holds messages only. Returns {1 if the BRPOP's
#: message was registered, the index in KEYS of the list taken from (0: none), how many
#: it still holds, the messages taken, oldest first}. A message without the delivery
#: tag and delivery info that ``QoS.append`` needs is not registered, and the taking
#: stops before it: kombu's path meets it, as it would have. Reads, then writes, then
#: pops: an error at a write (OOM) leaves the lists whole (an entry written before it
#: is a copy the visibility timeout restores, which the ledger's claim refuses).
FETCH_SCRIPT = """
local function entry(raw)
  local ok, m = pcall(cjson.decode, raw)
  if not ok or type(m) ~= 'table' then return nil end
  local p = m['properties']
  if type(p) ~= 'table' then return nil end
  local tag, info = p['delivery_tag'], p['delivery_info']
  if type(tag) ~= 'string' or type(info) ~= 'table' then return nil end
  local ex, rk = info['exchange'], info['routing_key']
  if ex == nil or rk == nil then return nil end
  return tag, '[' .. raw .. ',' .. cjson.encode(ex) .. ',' .. cjson.encode(rk) .. ']'
end
local now = ARGV[2]
local out = {0, 0, 0}
if ARGV[3] ~= '' then
  local tag, e = entry(ARGV[3])
  if tag then
    redis.call('ZADD', KEYS[2], now, tag)
    redis.call('HSET', KEYS[1], tag, e)
    out[1] = 1
  end
end
local n = tonumber(ARGV[1])
if n <= 0 then return out end
for k = 3, #KEYS do
  local tail = redis.call('LRANGE', KEYS[k], -n, -1)
  if #tail > 0 then
    local taken = 0
    for i = #tail, 1, -1 do
      local t, te = entry(tail[i])
      if not t then break end
      redis.call('ZADD', KEYS[2], now, t)
      redis.call('HSET', KEYS[1], t, te)
      out[#out + 1] = tail[i]
      taken = taken + 1
    end
    if taken > 0 then redis.call('RPOP', KEYS[k], taken) end
    out[2] = k
    out[3] = redis.call('LLEN', KEYS[k])
    return out
  end
end
return out
"""
_FETCH_SHA = hashlib.sha1(FETCH_SCRIPT.encode(), usedforsecurity=False).hexdigest()


def fetch_more(limit: int, room: int | None) -> int | None:
    """How many messages a fetch takes beyond the one its BRPOP took: up to ``limit``
    in all (the ``fetch_batch`` option), and no more than the QoS can take (``room``,
    ``can_consume_max_estimate()``, which counts the BRPOP's message; None: no
    prefetch limit). None: no script, kombu's path (``limit`` 0)."""
    if limit <= 0:
        return None
    total = limit if room is None else min(limit, room)
    return max(total - 1, 0)


def fetch_supported(version: tuple[int, ...]) -> bool:
    """Whether the fetch script may replace kombu's BRPOP read under this kombu
    ``(major, minor, ...)``: only the series it was written against."""
    return tuple(version[:2]) == FETCH_KOMBU


def _series(text: str) -> tuple[int, ...]:
    """``"5.7.0"`` -> ``(5, 7)`` (what is not a number ends it)."""
    out: list[int] = []
    for part in text.split(".")[:2]:
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


#: This process's kombu (read once).
KOMBU_VERSION = _installed("kombu")
FETCH_HERE = fetch_supported(_series(KOMBU_VERSION))
_said_unsupported = False


def _say_unsupported() -> None:
    """Once a process: this kombu is not the one the fetch follows."""
    global _said_unsupported
    if not _said_unsupported:
        _said_unsupported = True
        log.warning(
            "kombu %s: toolq's many-messages fetch is written for kombu %d.%d; "
            "using kombu's one message per fetch",
            KOMBU_VERSION,
            *FETCH_KOMBU,
        )


class QoS(kombu_redis.QoS):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Tags the fetch script registered in ``unacked`` and not yet delivered.
        self.toolq_registered: set[str] = set()

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag in self.toolq_registered:
            self.toolq_registered.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)  # Redis has it already
            return
        super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if take(delivery_tag):
            virtual.QoS.ack(self, delivery_tag)  # forget it here; Redis has it already
            return
        super().ack(delivery_tag)


class Channel(kombu_redis.Channel):
    QoS = QoS
    _toolq_client: redis.Redis | None = None
    _toolq_client_pool: Any = None
    #: Messages one fetch takes at most (the transport option; 0: kombu's path).
    fetch_batch: int = FETCH_BATCH
    #: Until when (monotonic) the fetch script is not tried again after a refusal.
    _toolq_refused_until: float = 0.0
    #: The last fetch left messages in its list: the next one is the script alone.
    _toolq_backlog: bool = False
    #: The lists the script sent in the BRPOP's place takes from (None: a BRPOP).
    _toolq_sent: list[str] | None = None

    from_transport_options = (*kombu_redis.Channel.from_transport_options, "fetch_batch")

    def _brpop_start(self, timeout: Any = None) -> None:
        """kombu's BRPOP, or, when the last fetch left messages in its list, the fetch
        script alone in its place (read by :meth:`_brpop_read` as its reply)."""
        c: Any = self
        self._toolq_sent = None
        total = self._toolq_room() if self._toolq_backlog else None
        if not total:
            kombu: Any = super()
            kombu._brpop_start(timeout)
            return
        queues = c._queue_cycle.consume(len(c.active_queues))
        if not queues:
            return
        lists = [c._q_for_pri(queue, pri) for pri in c.priority_steps for queue in queues]
        keys = self._toolq_keys(lists)
        c._in_poll = c.client.connection
        c._brpop_sent_at = monotonic()
        c.client.connection.send_command(
            "EVALSHA", _FETCH_SHA, len(keys), *keys, total, repr(time()), ""
        )
        self._toolq_sent = lists

    def _brpop_read(self, **options: Any) -> bool:
        """kombu 5.7's, with the fetch script after the BRPOP's reply (or its reply
        read instead, see :meth:`_brpop_start`)."""
        c: Any = self
        lists, self._toolq_sent = self._toolq_sent, None
        if not FETCH_HERE:  # another kombu: its own read (nothing of ours was sent)
            if self.fetch_batch:
                _say_unsupported()
            kombu_read: Any = super()
            return bool(kombu_read._brpop_read(**options))
        try:
            command = "BRPOP" if lists is None else "EVALSHA"
            try:
                reply = c.client.parse_response(c.client.connection, command, **options)
            except c.connection_errors:
                c.client.connection.disconnect()
                raise
            except ResponseError:  # the script refused, or unknown here (a restart)
                if lists is None:
                    raise
                self._toolq_backlog = False  # a BRPOP next: its fetch loads the script
                raise Empty() from None
            if lists is not None:
                _, index, left, *taken = reply
                if not index:
                    self._toolq_backlog = False
                    raise Empty()
                key = lists[index - 3]
                self._toolq_backlog = bool(left)
                self._toolq_deliver(key, None, taken)
                return True
            if not reply:
                raise Empty()
            key, item = reply
            self._toolq_deliver(bytes_to_str(key), item, None)
            return True
        finally:
            c._in_poll = None
            c._flush_brpop_reauth()

    def _toolq_keys(self, lists: list[str]) -> list[str]:
        """The fetch script's KEYS: kombu's ``unacked`` and ``unacked_index``, then
        ``lists``, with kombu's global key prefix."""
        c: Any = self
        prefix = c.global_keyprefix or ""
        return [prefix + k for k in (c.unacked_key, c.unacked_index_key, *lists)]

    def _toolq_room(self) -> int | None:
        """How many messages a fetch may take (None: the script is off or refused)."""
        c: Any = self
        qos = c.qos
        if not isinstance(qos, QoS) or monotonic() < self._toolq_refused_until:
            return None
        if not FETCH_HERE:
            return None
        more = fetch_more(int(self.fetch_batch or 0), qos.can_consume_max_estimate())
        return None if more is None else more + 1

    def _toolq_deliver(self, key: str, item: bytes | None, taken: list[bytes] | None) -> None:
        """Deliver the BRPOP's message ``item`` and what the fetch script took beside it
        (``taken`` None: the script is run here), or what the script took alone."""
        c: Any = self
        dest = key.rsplit(c.sep, 1)[0]
        if dest not in c.connection._callbacks:
            self._toolq_unconsumed(key, dest, item, taken)
            return
        c._queue_cycle.rotate(dest)
        qos = c.qos
        payloads = []
        if item is not None:
            first = loads(bytes_to_str(item))  # (what kombu cannot read fails here, first)
            total = self._toolq_room()
            fetched = None if total is None else self._toolq_fetch(key, item, total - 1)
            if fetched is None:  # kombu's path: QoS.append registers it
                c.connection._deliver(first, dest)
                return
            registered, taken = fetched
            if registered:
                qos.toolq_registered.add(first["properties"]["delivery_tag"])
            payloads.append(first)
        more = [loads(bytes_to_str(m)) for m in taken or ()]
        qos.toolq_registered.update(p["properties"]["delivery_tag"] for p in more)
        payloads += more
        try:
            while payloads:
                c.connection._deliver(payloads[0], dest)
                del payloads[0]
        except BaseException:
            # Not delivered (the consumer failed on one): those not in the QoS yet go
            # back to the list's head at once rather than after the visibility timeout.
            self._toolq_give_back(payloads)
            raise

    def _toolq_unconsumed(
        self, key: str, dest: str, item: bytes | None, taken: list[bytes] | None
    ) -> None:
        """A fetch's reply read after its consumer was cancelled: Celery's consumer
        reconnected while it was out, and the old channel reads it. Its messages go back
        to the head of their list, oldest next, with one line; kombu put each back at
        the tail with a WARNING apiece ("Requeuing undeliverable message for queue ...:
        No consumers"), which said a worker had no consumer for a queue it consumes.
        Not put back (the server away again): said at WARNING, and raised as kombu's
        would be; a message then lost from the broker is published again by the
        scheduler while its operation is ``queued`` (``recovery.unclaimed_after``)."""
        c: Any = self
        qos = c.qos
        tags = [loads(bytes_to_str(m))["properties"]["delivery_tag"] for m in taken or ()]
        n = len(tags) + (item is not None)
        try:
            for tag in reversed(tags):  # registered by the script: kombu's restore
                qos.restore_by_tag(tag)
            if item is not None:  # the BRPOP's alone, not registered: as it was
                with c.conn_or_acquire() as client:
                    client.rpush(key, item)
        except Exception as exc:
            log.warning(
                "%d message(s) of %s fetched as the consumer reconnected could not go back "
                "to the queue (%s)",
                n,
                dest,
                type(exc).__name__,
            )
            raise
        log.info(
            "%d message(s) of %s fetched as the consumer reconnected went back to the queue",
            n,
            dest,
        )

    def _toolq_give_back(self, payloads: list[dict[str, Any]]) -> None:
        c: Any = self
        qos = c.qos
        for p in reversed(payloads):
            tag = p["properties"]["delivery_tag"]
            if tag in qos.toolq_registered:
                qos.toolq_registered.discard(tag)
                qos.restore_by_tag(tag)

    def _toolq_fetch(self, key: str, item: bytes, more: int) -> tuple[bool, list[bytes]] | None:
        """Register the BRPOP's message and take up to ``more`` beside it from its list,
        in one script call: (whether it was registered, the messages taken). None: the
        server refused the script (nothing was taken): kombu's path."""
        c: Any = self
        keys = tuple(self._toolq_keys([key]))
        try:
            with c.conn_or_acquire() as client:
                registered, _, left, *taken = _evalsha(client, keys, (more, repr(time()), item))
        except ResponseError as exc:
            self._toolq_refused_until = monotonic() + REFUSED_PAUSE_S
            self._toolq_backlog = False
            log.warning(
                "the broker refused the fetch script (%s); one message per fetch for %.0f s",
                exc,
                REFUSED_PAUSE_S,
            )
            return None
        self._toolq_backlog = bool(left)
        return bool(registered), list(taken)

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


def _evalsha(client: Any, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
    """The fetch script, by its hash (loaded on the first NOSCRIPT). Through redis-py's
    own ``execute_command``: a prefixed kombu client would prefix the first key
    again (the keys are prefixed already)."""
    run: Any = redis.Redis.execute_command
    try:
        return run(client, "EVALSHA", _FETCH_SHA, len(keys), *keys, *args)
    except NoScriptError:
        return run(client, "EVAL", FETCH_SCRIPT, len(keys), *keys, *args)


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool asks the Sentinels for the primary, again
    on every new connection: a failover is followed) with toolq's client reuse and
    fetches."""

    # kombu's Sentinel options (master_name, ...), not those of the plain channel that
    # Channel, first in the bases, would give
    from_transport_options = (*kombu_redis.SentinelChannel.from_transport_options, "fetch_batch")


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
