"""Waiting for a wake-up: what the scheduler and the relay do when nothing is due.

One server: a script that adds a due item pushes to its cell's wake list and one
``BLPOP`` waits on the wake lists of every cell a scheduler walks
(:class:`WakeLists`); a relay's ``XREADGROUP`` of every outbox blocks until an entry
comes (:class:`BlockingOutboxes`). A Cluster: one command cannot name keys of several
slots, so both listen to the cells' notice channels instead (:class:`Notices`: a
script that adds a due item or an outbox entry announces the state it entered in the
same step) and look again when one arrives (:class:`NoticeWake`,
:class:`NoticeOutboxes`). A quiet transition (no notice) is seen at the next planned
look. The topology picks the class per mode (:func:`wake_listener`,
:func:`outbox_reader`); the services never test the mode.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from toolq.core.keys import OUTBOX_GROUP, Keys
from toolq.core.text import as_text
from toolq.topology.model import Topology
from toolq.topology.nodes import ClusterNodes, Nodes, OneServer

log = logging.getLogger("toolq.listen")

#: Sleeps shorter than this are taken locally rather than in a blocking BLPOP.
SHORT_SLEEP_S = 0.1
#: Cluster: a scheduler woken by a notice looks again, but not sooner than this after
#: its last look (under load notices never stop); a quiet transition (no notice) is
#: seen at the planned wake-up, at most ``max_sleep`` later.
CLUSTER_POLL_S = 0.5
#: Cluster: how often a relay reads every cell's outbox (between two, only those of
#: the cells whose notices it heard: quiet transitions, such as a republish, announce
#: nothing).
FULL_READ_S = 1.0
#: What a notice subscription answers that means "look": a notice, or a channel whose
#: slot left its node (subscribed again; what it announced meanwhile is gone).
HEARD = ("message", "unsubscribe")


class Subscribed(Protocol):
    """What a notice subscription answers (:class:`toolq.adapters.notify.Subscription`)."""

    def get_message(self, timeout: float) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


Subscribe = Callable[[list[str]], Subscribed]


class Notices:
    """A subscription to some notice channels that says which of them were heard.

    It follows the channels asked for (subscribed afresh when they change) and is
    dropped after a failed round (:meth:`drop`): subscribed again on the next use.
    """

    def __init__(self, subscribe: Subscribe) -> None:
        self._subscribe = subscribe
        self._sub: Subscribed | None = None
        self.channels: list[str] = []

    def follow(self, channels: Sequence[str]) -> bool:
        """Listen to ``channels``; True when that took a new subscription (what was
        announced before it is not heard: the caller looks at everything once)."""
        wanted = list(channels)
        if self._sub is not None and self.channels == wanted:
            return False
        self.drop()
        self._sub = self._subscribe(wanted)
        self.channels = wanted
        return True

    def collect(self, timeout: float) -> set[str]:
        """The channels heard: waits up to ``timeout`` for the first message, then takes
        every one already there (one look answers them all: none piles up)."""
        heard: set[str] = set()
        if self._sub is None:
            return heard
        msg = self._sub.get_message(timeout=timeout)
        while msg is not None:
            if msg.get("type") in HEARD:
                heard.add(as_text(msg.get("channel", "")))
            msg = self._sub.get_message(timeout=0.0)
        return heard

    def drop(self) -> None:
        sub, self._sub, self.channels = self._sub, None, []
        if sub is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                sub.close()


def _channels(cells: Sequence[Keys]) -> list[str]:
    return [ch for k in cells for ch in (k.notify, k.notify_steps)]


# --------------------------------------------------------------------------- the scheduler's


class WakeListener(ABC):
    """How a scheduler with nothing due sleeps until its planned wake-up, or until a
    script adds an item due sooner in one of the ``cells`` it walks."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop

    @abstractmethod
    def wait(self, seconds: float, cells: Sequence[Keys]) -> None:
        """Sleep up to ``seconds``; woken early by news in ``cells`` or by the stop."""

    def interrupt(self, cells: Sequence[Keys]) -> None:  # noqa: B027  (nothing blocks)
        """Wake a wait at once (safe from a signal handler); the stop is already set."""

    def drop(self) -> None:  # noqa: B027  (nothing held)
        """A round failed: let go of what may be broken (taken again on the next wait)."""

    def close(self) -> None:
        self.drop()


class _OwnConnection:
    """A connection of its own for blocking reads (a blocked command holds it), made on
    first use with a read timeout 10 s past the longest block, closed with its owner."""

    def __init__(self, redis_url: str) -> None:
        self._url = redis_url
        self._blocking: redis.Redis | None = None

    def _own(self, longest_block_s: float) -> redis.Redis:
        if self._blocking is None:
            self._blocking = redis.Redis.from_url(
                self._url, socket_timeout=longest_block_s + 10, socket_connect_timeout=5
            )
        return self._blocking

    def close(self) -> None:
        if self._blocking is not None:
            self._blocking.close()
            self._blocking = None


class WakeLists(_OwnConnection, WakeListener):
    """One server: one ``BLPOP`` of the cells' wake lists, on a connection of its own."""

    def __init__(self, stop: threading.Event, redis_url: str, max_sleep: float) -> None:
        WakeListener.__init__(self, stop)
        _OwnConnection.__init__(self, redis_url)
        self._max_sleep = max_sleep

    def wait(self, seconds: float, cells: Sequence[Keys]) -> None:
        wakes = [k.wake for k in cells]
        if seconds < SHORT_SLEEP_S or not wakes:
            # A server checks blocked clients' timeouts only every 1/hz s (100 ms at
            # the default hz 10): a short BLPOP would oversleep. Sleep here instead.
            self._stop.wait(seconds)
            return
        # An idle server times blocked clients out only when its event loop wakes
        # (every 1/hz s): block until SHORT_SLEEP_S before the due time, and the rest
        # is taken on the next round's plan.
        timeout = max(seconds - SHORT_SLEEP_S, 0.01)  # 0 would block for ever
        self.blocking_client().blpop(wakes, timeout=timeout)

    def interrupt(self, cells: Sequence[Keys]) -> None:
        if not cells:
            return  # nothing held: the wait is the stop's own
        # A connection of its own: a signal may interrupt the pool's lock holder.
        with (
            contextlib.suppress(redis.RedisError),
            redis.Redis.from_url(self._url, socket_timeout=1) as client,
        ):
            client.lpush(cells[0].wake, "stop")

    def blocking_client(self) -> redis.Redis:
        """The blocking reads' connection, with a read timeout past the longest sleep."""
        return self._own(self._max_sleep)


class NoticeWake(WakeListener):
    """A Cluster: the cells' notice channels (SSUBSCRIBE per node), following the cells
    walked. Woken by one, it returns at least CLUSTER_POLL_S after it began; the stop
    is seen within a second (nothing blocks on a wake list to interrupt)."""

    def __init__(self, stop: threading.Event, subscribe: Subscribe) -> None:
        super().__init__(stop)
        self.notices = Notices(subscribe)

    def wait(self, seconds: float, cells: Sequence[Keys]) -> None:
        began = time.monotonic()
        channels = _channels(cells)
        if not channels:
            self.notices.drop()
            self._stop.wait(seconds)
            return
        self.notices.follow(channels)
        end = began + seconds
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            if self.notices.collect(min(left, 1.0)):
                self._stop.wait(max(0.0, began + CLUSTER_POLL_S - time.monotonic()))
                return

    def drop(self) -> None:
        self.notices.drop()


# --------------------------------------------------------------------------- the relay's


class OutboxReader(ABC):
    """How a relay reads the outboxes (``streams``, one per cell) in its consumer group,
    waits when they are empty, and acknowledges what it published."""

    def __init__(self, client: redis.Redis, streams: Sequence[str], consumer: str) -> None:
        self.client = client
        self.streams = list(streams)
        self.consumer = consumer

    @abstractmethod
    def read(self, last: str, count: int, block_ms: int | None) -> list[tuple[str, Any]]:
        """(stream, entries) read from ``last`` (``">"``: new ones; ``"0"``: this
        consumer's pending ones); ``block_ms``: how long a read of new ones may wait."""

    def idle(self, seconds: float) -> None:  # noqa: B027  (the read waited already)
        """Nothing was read: wait for something to read, up to ``seconds``."""

    @abstractmethod
    def ack(self, by_stream: dict[str, list[str]]) -> None:
        """Acknowledge and delete these entries."""

    def drop(self) -> None:  # noqa: B027  (nothing held)
        """A round failed: let go of what may be broken."""

    def close(self) -> None:
        self.drop()


def _pairs(reply: Any) -> list[tuple[str, Any]]:
    """An ``XREADGROUP`` reply as (stream, entries) (RESP2: a list of [name, entries];
    RESP3: a dict of name -> entries)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    return [(as_text(name), raw) for name, raw in pairs]


class BlockingOutboxes(_OwnConnection, OutboxReader):
    """One server: one ``XREADGROUP`` of every outbox, blocking while they are empty (no
    polling tick) on a connection of its own; acknowledged in one transaction."""

    def __init__(
        self, client: redis.Redis, streams: Sequence[str], consumer: str, redis_url: str
    ) -> None:
        OutboxReader.__init__(self, client, streams, consumer)
        _OwnConnection.__init__(self, redis_url)
        #: Its blocking reads' longest wait, for the connection's read timeout.
        self.block_s = 0.0

    def read(self, last: str, count: int, block_ms: int | None) -> list[tuple[str, Any]]:
        blocks = block_ms is not None and last == ">"
        client = self.blocking_client(block_ms or 0) if blocks else self.client
        reply: Any = client.xreadgroup(
            OUTBOX_GROUP,
            self.consumer,
            dict.fromkeys(self.streams, last),
            count=count,
            block=block_ms if blocks else None,
        )
        return _pairs(reply)

    def ack(self, by_stream: dict[str, list[str]]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for stream, ids in by_stream.items():
            pipe.xack(stream, OUTBOX_GROUP, *ids)
            pipe.xdel(stream, *ids)
        pipe.execute()

    def blocking_client(self, block_ms: int) -> redis.Redis:
        return self._own(block_ms / 1000)


class NoticeOutboxes(OutboxReader):
    """A Cluster: a read per cell, each on its node, never blocking: of the cells whose
    notices were heard, and of every cell each FULL_READ_S (a non-blocking read of all
    costs the nodes ~8 ms of CPU at 256 cells). No transaction spans slots: a batch is
    deleted then acknowledged per stream, so a relay killed in between leaves a pending
    id whose entry is gone, which the next ``XAUTOCLAIM`` drops."""

    def __init__(
        self,
        client: redis.Redis,
        cells: Sequence[Keys],
        consumer: str,
        subscribe: Subscribe,
    ) -> None:
        super().__init__(client, [k.outbox for k in cells], consumer)
        #: notice channel -> its cell's outbox
        self._outbox_of = {ch: k.outbox for k in cells for ch in (k.notify, k.notify_steps)}
        self.notices = Notices(subscribe)
        self._heard: set[str] = set()
        self._full_read = -math.inf

    def read(self, last: str, count: int, block_ms: int | None) -> list[tuple[str, Any]]:
        streams = self._to_read() if last == ">" else self.streams
        if not streams:
            return []
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.xreadgroup(OUTBOX_GROUP, self.consumer, {stream: last}, count=count)
        return [pair for reply in pipe.execute() for pair in _pairs(reply)]

    def _to_read(self) -> list[str]:
        """The outboxes to read now: those heard of, or all now and then."""
        now = time.monotonic()
        self._collect(0.0)
        if now - self._full_read >= FULL_READ_S:
            self._full_read = now
            self._heard.clear()
            return self.streams
        heard, self._heard = self._heard, set()
        return [s for s in self.streams if s in heard]

    def idle(self, seconds: float) -> None:
        """Wait for a notice, or the next full read."""
        self._collect(min(seconds, max(0.0, self._full_read + FULL_READ_S - time.monotonic())))

    def _collect(self, timeout: float) -> None:
        if self.notices.follow(list(self._outbox_of)):
            self._full_read = -math.inf  # what was announced before is read in full
        for channel in self.notices.collect(timeout):
            stream = self._outbox_of.get(channel)
            if stream is not None:
                self._heard.add(stream)

    def ack(self, by_stream: dict[str, list[str]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xdel(stream, *ids)
            pipe.xack(stream, OUTBOX_GROUP, *ids)
        pipe.execute()

    def drop(self) -> None:
        self.notices.drop()  # subscribed again, and everything read, next round


# --------------------------------------------------------------------------- the choice


def _subscriber(topology: Topology, client: redis.Redis) -> Subscribe:
    """Subscriptions of this topology's kind (a Cluster's: SSUBSCRIBE per node)."""
    return lambda channels: topology.notices.subscribe(client, channels)


def wake_listener(
    topology: Topology,
    stop: threading.Event,
    *,
    client: redis.Redis,
    redis_url: str,
    max_sleep: float,
) -> WakeListener:
    """How a scheduler on this topology's nodes waits for a wake-up."""
    build: dict[type[Nodes], Callable[[], WakeListener]] = {
        OneServer: lambda: WakeLists(stop, redis_url, max_sleep),
        ClusterNodes: lambda: NoticeWake(stop, _subscriber(topology, client)),
    }
    return build[type(topology.nodes)]()


def outbox_reader(
    topology: Topology, *, client: redis.Redis, redis_url: str, consumer: str
) -> OutboxReader:
    """How a relay on this topology's nodes reads the outboxes of its layout's cells."""
    cells = topology.layout.every_cell()
    build: dict[type[Nodes], Callable[[], OutboxReader]] = {
        OneServer: lambda: BlockingOutboxes(client, [k.outbox for k in cells], consumer, redis_url),
        ClusterNodes: lambda: NoticeOutboxes(
            client, cells, consumer, _subscriber(topology, client)
        ),
    }
    return build[type(topology.nodes)]()
