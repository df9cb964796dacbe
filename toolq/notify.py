"""Notices: what the ledger and the workers publish, and the subscriptions that wake waiters.

Two kinds of notice, on two Pub/Sub channels:

- ``"<state> <ref>\\n<rev> <seq>\\n<envelope>"``: a transition entered a state
  (published by the ledger scripts, :mod:`toolq.ledger.scripts`, for every
  transition but a quiet field update). ``rev`` is the record's revision,
  ``seq`` the 1-based index of the history entry it appended, ``envelope``
  the envelope the transition wrote ("" if none). A waiter that read an older
  revision takes the outcome from the notice: a settled call costs no second
  read.
- ``"progress <ref>\\n{"fraction": f, "message": m}"``: what a tool reported
  through ``CallContext.progress`` (:class:`ProgressPublisher`, in the worker).

Settled states go to ``Keys.notify``, everything else (unsettled states,
progress) to ``Keys.notify_steps``: one SPUBLISH per transition either way, and
a process that only waits subscribes to the first and hears one notice per call.
Both channels carry the cell's hash tag: notices are sharded Pub/Sub, on one
server as on a Cluster, where each stays on the node of its cell
(:class:`Subscription` says how subscribers follow them there).

Subscribers, each one subscription shared by every waiter it serves:

- :class:`Notifier` for the sync client: one thread per process, settled states only;
- :class:`AsyncNotifier` for ``tq.aio``: one task per event loop (redis.asyncio
  connections belong to the loop they were made on), no thread.

Both subscribe again after a lost connection or a moved slot, and then wake
every waiter to read its record again: notices published meanwhile are gone.
The scheduler and the relay of a Cluster hear notices through
:class:`Subscription` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import select
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from toolq.redact import scrub
from toolq.states import State

log = logging.getLogger("toolq.notify")

#: The first word of a progress notice (never a state's name).
PROGRESS = "progress"
#: A worker publishes at most one progress notice per operation this often
#: (the last word, fraction 1.0, always goes): 10 a second is smooth for a
#: person and nothing for the server.
PROGRESS_EVERY_S = 0.1
#: After a failed publish a worker stops trying for this long: a tool that
#: reports progress in a tight loop must not wait on a dead server each time.
PROGRESS_PAUSE_S = 5.0
#: The longest progress message that travels (after scrubbing).
PROGRESS_MESSAGE_MAX = 200
#: Events a waiter holds before it gives up on them and reads the record instead
#: (a watcher that stopped consuming must not grow without bound).
WAITER_BACKLOG = 1000
#: Notices the async subscriber dispatches before it lets the loop run: a burst of
#: 1,000 settled calls would otherwise be read, and their waiters woken, in one
#: pass of the loop (tens of ms with nothing else running; bench/aio_bench.py).
DISPATCH_PER_PASS = 4


@dataclass(frozen=True)
class Notice:
    """A state notice as published: the state entered, the revision, the envelope JSON."""

    state: str
    rev: int
    #: The envelope JSON the transition wrote; "" when it wrote none.
    envelope: str
    #: The 1-based index of the history entry the transition appended (0: not said).
    seq: int = 0


@dataclass(frozen=True)
class Progress:
    """What a tool reported: how far it is (0..1), and a short scrubbed line."""

    fraction: float
    message: str | None = None


@dataclass(frozen=True)
class Event:
    """One notice about one operation, as waiters and watchers receive it.

    ``kind="state"``: ``state``, ``rev``, ``seq`` and ``envelope``, the JSON the
    transition wrote ("" when none; :func:`toolq.record.load_envelope` parses it,
    so a subscriber parses nothing it does not need). ``kind="progress"``:
    ``progress`` only.
    """

    kind: Literal["state", "progress"]
    state: State | None = None
    rev: int = 0
    progress: Progress | None = None
    envelope: str = ""
    #: The 1-based index of this state's entry in the history (``tq.aio.history(after=)``).
    seq: int = 0
    ref: str = ""


def parse_notice(text: str) -> tuple[str, Notice | None]:
    """``(ref, notice)`` of a state notice; the notice is None when the text carries no
    revision (read the record again)."""
    head, _, rest = text.partition("\n")
    state, _, ref = head.partition(" ")
    numbers, _, envelope = rest.partition("\n")
    rev, _, seq = numbers.partition(" ")
    if not rev.isdigit() or (seq and not seq.isdigit()):
        return ref, None
    return ref, Notice(state, int(rev), envelope, int(seq or 0))


def progress_notice(ref: str, fraction: float, message: str | None) -> str:
    body: dict[str, Any] = {"fraction": fraction}
    if message:
        body["message"] = scrub(message)[:PROGRESS_MESSAGE_MAX]
    return f"{PROGRESS} {ref}\n{json.dumps(body, separators=(',', ':'))}"


def notice_ref(text: str) -> str:
    """The ref a notice is about: all a subscriber needs to skip one nobody waits for."""
    head = text.partition("\n")[0]
    return head.partition(" ")[2]


def to_event(text: str) -> Event | None:
    """The event a notice says; None when it says nothing trustworthy (read the record)."""
    if text.startswith(PROGRESS + " "):
        head, _, body = text.partition("\n")
        try:
            data = json.loads(body)
            fraction = float(data["fraction"])
            message = data.get("message")
        except (ValueError, KeyError, TypeError):
            return None
        if not 0.0 <= fraction <= 1.0 or not isinstance(message, str | None):
            return None
        ref = head.partition(" ")[2]
        return Event("progress", progress=Progress(fraction, message), ref=ref)
    ref, n = parse_notice(text)
    if n is None:
        return None
    try:
        state = State(n.state)
    except ValueError:
        return None
    return Event("state", state=state, rev=n.rev, envelope=n.envelope, seq=n.seq, ref=ref)


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


# --------------------------------------------------------------------------- publishing progress


class ProgressPublisher:
    """Publishes what tools report through ``CallContext.progress`` (in the worker).

    Rate-limited per operation (:data:`PROGRESS_EVERY_S`), best effort: a
    failed publish is logged and dropped, never raised into the tool.
    """

    def __init__(
        self,
        client: redis.Redis,
        channel: str | Callable[[str], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        #: The steps channel, or (cells mode) the steps channel of a ref's cell.
        self.channel = channel
        self.clock = clock
        self._paused_until = 0.0

    def reporter(self, ref: str) -> Callable[[float, str | None], None]:
        """The ``progress_cb`` of one attempt of ``ref``."""
        last = -math.inf

        def report(fraction: float, message: str | None) -> None:
            nonlocal last
            now = self.clock()
            if fraction < 1.0 and now - last < PROGRESS_EVERY_S:
                return
            last = now
            self.publish(ref, fraction, message)

        return report

    def publish(self, ref: str, fraction: float, message: str | None) -> bool:
        if self.clock() < self._paused_until:
            return False
        try:
            channel = self.channel if isinstance(self.channel, str) else self.channel(ref)
            # Sharded, as the scripts' notices (Subscription says why).
            self.client.spublish(channel, progress_notice(ref, fraction, message))
        except (redis.RedisError, OSError):
            self._paused_until = self.clock() + PROGRESS_PAUSE_S
            log.debug("progress of %s not published", ref, exc_info=True)
            return False
        return True


# --------------------------------------------------------------------------- subscribing


#: After a channel could not be subscribed (its node down, its slot moving), the
#: next try waits this long: a failover takes a second or two, a migration less.
PLACE_RETRY_S = 0.2


def _on_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


#: Sharded Pub/Sub's kinds of message, as the classic ones the subscribers read.
_CLASSIC_KIND = {"smessage": "message", "ssubscribe": "subscribe", "sunsubscribe": "unsubscribe"}


def _as_classic(msg: dict[str, Any]) -> dict[str, Any]:
    """A sharded message under its classic kind (other messages as they are)."""
    kind = _CLASSIC_KIND.get(msg.get("type"))  # type: ignore[arg-type]
    return msg if kind is None else {**msg, "type": kind}


def _owners(cluster: Any, channels: Sequence[str]) -> dict[str, list[str]]:
    """The channels by the name of the node serving each one's slot (the client's map)."""
    owners: dict[str, list[str]] = defaultdict(list)
    for channel in channels:
        owners[cluster.get_node_from_key(channel).name].append(channel)
    return owners


def _unplace(where: dict[str, str], homeless: list[str], node: str) -> None:
    """Forget that the channels subscribed on ``node`` are; they wait in ``homeless``."""
    gone = [c for c, n in where.items() if n == node]
    for channel in gone:
        del where[channel]
    homeless += [c for c in gone if c not in homeless]


class Subscription:
    """``SSUBSCRIBE`` to notice channels, on one server or on a Cluster (sync).

    The scripts ``SPUBLISH`` a cell's notices to a channel in the cell's slot,
    so on a Cluster a notice stays on the node that ran the script (a classic
    ``PUBLISH`` is broadcast over the cluster bus to every node). A subscriber
    therefore holds one connection per primary owning some of its channels,
    each channel subscribed there by itself (one ``SSUBSCRIBE`` cannot span
    slots). On one server: one connection, one ``SSUBSCRIBE`` of them all.

    :meth:`get_message` answers as redis-py's ``PubSub`` does, with the sharded
    kinds renamed: ``"message"``, and ``"subscribe"`` for each confirmation. A
    channel whose slot left its node (a slot migration sends ``sunsubscribe``, a
    failover or a lost connection breaks it) is subscribed again on its owner,
    looked up afresh, so the caller counts one confirmation more than it has
    channels: notices published meanwhile are gone, waiters read again.
    """

    def __init__(self, client: redis.Redis, channels: Sequence[str] = ()) -> None:
        self.client = client
        self.cluster = _on_cluster(client)
        self.channels: list[str] = []
        #: Node name ("" on one server) -> its connection; channel -> its node.
        self._subs: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        #: Channels subscribed nowhere now, and when to try them again.
        self._homeless: list[str] = []
        self._retry_at = 0.0
        self._stale = False
        self._turn = 0
        self.add(*channels)

    def add(self, *channels: str) -> None:
        """Subscribe to these too (on the next :meth:`get_message` if it fails now)."""
        new = [c for c in dict.fromkeys(channels) if c not in self.channels]
        self.channels += new
        self._homeless += new

    def get_message(self, timeout: float) -> dict[str, Any] | None:
        """The next message, waiting up to ``timeout`` s. Raises ``redis.ConnectionError``
        when a node could not be reached or refused a channel: those channels are
        subscribed again on a later call (the others are still heard)."""
        self._place()
        if self._homeless:  # some wait to be placed again: no longer than that
            timeout = min(timeout, max(0.0, self._retry_at - time.monotonic()))
        deadline = time.monotonic() + timeout
        if not self._subs:  # nothing to hear, or nothing placed yet (a later call tries)
            wait = timeout if not self._homeless else self._retry_at - time.monotonic()
            time.sleep(max(0.0, min(timeout, wait)))
            return None
        if len(self._subs) == 1:
            ((node, sub),) = self._subs.items()
            return self._read(node, sub, timeout)
        while True:
            nodes = list(self._subs.items())
            self._turn = (self._turn + 1) % len(nodes)
            for node, sub in nodes[self._turn :] + nodes[: self._turn]:  # none starves
                msg = self._read(node, sub, 0.0)
                if msg is not None:
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # A plain select on the node connections' sockets: redis-py waits on one
            # connection at a time (what it buffered was drained just above).
            socks = [s.connection._sock for s in self._subs.values() if s.connection]
            select.select([s for s in socks if s is not None], [], [], left)

    def nodes(self) -> set[str]:
        """The nodes it holds a connection to ("" on one server)."""
        return set(self._subs)

    def close(self) -> None:
        for node in list(self._subs):
            self._drop(node)

    def _read(self, node: str, sub: Any, timeout: float) -> dict[str, Any] | None:
        try:
            msg: dict[str, Any] | None = sub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._lost(node)
            raise
        except redis.ResponseError as exc:  # MOVED, CROSSSLOT, CLUSTERDOWN: placed again
            self._lost(node)
            raise redis.ConnectionError(f"notices of {node or 'the server'}: {exc}") from exc
        if msg is None:
            return None
        if msg.get("type") == "sunsubscribe":
            # The channel's slot left this node (we never unsubscribe): to its new owner.
            channel = _text(msg["channel"])
            sub.shard_channels.pop(msg["channel"], None)  # else a reconnect asks for it again
            if self._where.pop(channel, None) is not None:
                self._homeless.append(channel)
                self._stale = True
            if self.cluster and node not in self._where.values():
                self._drop(node)  # its last channel moved away: nothing to hear there
        return _as_classic(msg)

    def _place(self) -> None:
        """Subscribe the homeless channels on their owners (one server: all at once)."""
        if not self._homeless or time.monotonic() < self._retry_at:
            return
        if not self.cluster:
            sub = self._subs.get("")
            if sub is None:
                sub = self._subs[""] = self.client.pubsub()  # type: ignore[no-untyped-call]
            self._subscribe("", sub, list(self._homeless))
            return
        cluster: Any = self.client
        try:
            if self._stale:
                cluster.nodes_manager.initialize()
                self._stale = False
            owners = _owners(cluster, self._homeless)
        except (RedisClusterException, redis.RedisError, OSError) as exc:
            self._stale = True
            self._retry_at = time.monotonic() + PLACE_RETRY_S
            raise redis.ConnectionError(f"notices: no map of the cluster ({exc})") from exc
        for node, channels in owners.items():
            sub = self._subs.get(node)
            if sub is None:
                # A pool of its own: the cluster client marks its pools' connections
                # for reconnecting whenever it reads the map again (a subscription
                # would be dropped, and its notices lost, each time).
                shared = cluster.get_redis_connection(cluster.get_node(node_name=node))
                pool = redis.ConnectionPool(
                    connection_class=shared.connection_pool.connection_class,
                    **shared.connection_pool.connection_kwargs,
                )
                own = redis.Redis(connection_pool=pool)
                sub = self._subs[node] = own.pubsub()  # type: ignore[no-untyped-call]
            self._subscribe(node, sub, channels)

    def _subscribe(self, node: str, sub: Any, channels: list[str]) -> None:
        try:
            if self.cluster:
                for channel in channels:
                    sub.ssubscribe(channel)
            else:
                sub.ssubscribe(*channels)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._lost(node)
            raise
        for channel in channels:
            self._where[channel] = node
        placed = set(channels)
        self._homeless = [c for c in self._homeless if c not in placed]

    def _lost(self, node: str) -> None:
        """A node's connection failed: its channels wait to be placed again."""
        self._drop(node)
        self._stale = self.cluster
        self._retry_at = time.monotonic() + PLACE_RETRY_S

    def _drop(self, node: str) -> None:
        sub = self._subs.pop(node, None)
        _unplace(self._where, self._homeless, node)
        if sub is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                sub.close()
                if self.cluster:
                    sub.connection_pool.disconnect()


class AsyncSubscription:
    """:class:`Subscription` for ``redis.asyncio`` (one server, or its ``RedisCluster``).

    On one server one ``PubSub`` read directly. On a Cluster one connection per
    primary as there, each read by a task of its own that hands what it hears
    to :meth:`get_message` (awaiting several connections at once, without
    cancelling a read halfway through a reply).
    """

    def __init__(self, client: Any, channels: Sequence[str] = ()) -> None:
        self.client = client
        self.cluster = _on_cluster(client)
        self.channels: list[str] = []
        self._subs: dict[str, PubSub] = {}
        self._pools: dict[str, aioredis.ConnectionPool] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._inbox: asyncio.Queue[tuple[str, PubSub, dict[str, Any] | BaseException]] = (
            asyncio.Queue()
        )
        self._where: dict[str, str] = {}
        self._homeless: list[str] = []
        self._retry_at = 0.0
        self._stale = False
        self._placing = asyncio.Lock()
        self.channels += list(dict.fromkeys(channels))
        self._homeless += self.channels

    async def add(self, *channels: str) -> None:
        """Subscribe to these too, now (or on a later :meth:`get_message`)."""
        new = [c for c in dict.fromkeys(channels) if c not in self.channels]
        self.channels += new
        self._homeless += new
        if new and self._subs:  # a live subscription takes them at once
            await self._place()

    async def get_message(self, timeout: float) -> dict[str, Any] | None:
        """As :meth:`Subscription.get_message`."""
        await self._place()
        if not self._subs:
            wait = timeout if not self._homeless else self._retry_at - time.monotonic()
            await asyncio.sleep(max(0.0, min(timeout, wait)))
            return None
        if not self.cluster:
            sub = self._subs[""]
            try:
                msg = await sub.get_message(timeout=timeout)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                await self._lost("")
                raise
            return None if msg is None else self._sharded("", sub, msg)
        if self._homeless:  # some wait to be placed again: no longer than that
            timeout = min(timeout, max(0.0, self._retry_at - time.monotonic()))
        try:
            async with asyncio.timeout(timeout):
                node, sub, heard = await self._inbox.get()
        except TimeoutError:
            return None
        if self._subs.get(node) is not sub:
            return None  # from a connection dropped since
        if isinstance(heard, BaseException):
            await self._lost(node)
            raise redis.ConnectionError(f"notices of {node}: {heard}") from heard
        msg = self._sharded(node, sub, heard)
        if msg["type"] == "unsubscribe":
            # Its last channel moved away: close it and its reader (under the placing
            # lock: a channel being subscribed there meanwhile keeps it).
            async with self._placing:
                if self._subs.get(node) is sub and node not in self._where.values():
                    await self._drop(node)
        return msg

    def nodes(self) -> set[str]:
        """As :meth:`Subscription.nodes`."""
        return set(self._subs)

    async def aclose(self) -> None:
        for node in list(self._subs):
            await self._drop(node)

    def _sharded(self, node: str, sub: PubSub, msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("type") == "sunsubscribe":
            channel = _text(msg["channel"])
            sub.shard_channels.pop(msg["channel"], None)
            if self._where.pop(channel, None) is not None:
                self._homeless.append(channel)
                self._stale = True
        return _as_classic(msg)

    async def _place(self) -> None:
        async with self._placing:
            if not self._homeless or time.monotonic() < self._retry_at:
                return
            if not self.cluster:
                sub = self._subs.get("")
                if sub is None:
                    sub = self._subs[""] = self.client.pubsub()
                await self._subscribe("", sub, list(self._homeless))
                return
            cluster = self.client
            try:
                await cluster.initialize()  # a new client's first map (then: nothing)
                if self._stale:
                    await cluster.nodes_manager.initialize()
                    self._stale = False
                owners = _owners(cluster, self._homeless)
            except (RedisClusterException, redis.RedisError, OSError) as exc:
                self._stale = True
                self._retry_at = time.monotonic() + PLACE_RETRY_S
                raise redis.ConnectionError(f"notices: no map of the cluster ({exc})") from exc
            for name, channels in owners.items():
                sub = self._subs.get(name)
                if sub is None:
                    node = cluster.get_node(node_name=name)
                    pool = self._pools[name] = aioredis.ConnectionPool(
                        connection_class=node.connection_class, **node.connection_kwargs
                    )
                    sub = self._subs[name] = PubSub(pool)
                await self._subscribe(name, sub, channels)
                if name not in self._readers:  # once connected: a PubSub reads nothing before
                    self._readers[name] = asyncio.get_running_loop().create_task(
                        self._read(name, sub), name=f"toolq-notices-{name}"
                    )

    async def _read(self, node: str, sub: PubSub) -> None:
        """A Cluster node's reader: everything it hears, until its connection fails."""
        try:
            while True:
                msg = await sub.get_message(timeout=30.0)
                if msg is not None:
                    self._inbox.put_nowait((node, sub, msg))
        except Exception as exc:  # told to get_message, which raises
            self._inbox.put_nowait((node, sub, exc))

    async def _subscribe(self, node: str, sub: PubSub, channels: list[str]) -> None:
        try:
            if self.cluster:
                for channel in channels:
                    await sub.ssubscribe(channel)
            else:
                await sub.ssubscribe(*channels)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            await self._lost(node)
            raise
        for channel in channels:
            self._where[channel] = node
        placed = set(channels)
        self._homeless = [c for c in self._homeless if c not in placed]

    async def _lost(self, node: str) -> None:
        await self._drop(node)
        self._stale = self.cluster
        self._retry_at = time.monotonic() + PLACE_RETRY_S

    async def _drop(self, node: str) -> None:
        sub = self._subs.pop(node, None)
        reader = self._readers.pop(node, None)
        pool = self._pools.pop(node, None)
        _unplace(self._where, self._homeless, node)
        if reader is not None:
            reader.cancel()
            await asyncio.wait([reader])  # its end; the caller's cancellation still raises
        with contextlib.suppress(Exception):  # closing a broken connection
            if sub is not None:
                await sub.aclose()  # type: ignore[no-untyped-call]
            if pool is not None:
                await pool.disconnect()


# --------------------------------------------------------------------------- the sync subscriber


class Wake(threading.Event):
    """Set when a transition of the watched ref is published, or when the subscription
    came back after a loss (``reread``: notices may have been missed)."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__()
        self._lock = lock
        self._notice: Event | None = None
        self._reread = False

    def put(self, event: Event | None) -> None:
        """(Under the notifier's lock.) Keep the newest state notice; None: read again."""
        if event is None:
            self._reread = True
        elif event.kind == "state" and (self._notice is None or event.rev >= self._notice.rev):
            self._notice = event
        else:
            return
        self.set()

    def take(self) -> tuple[Event | None, bool]:
        """The newest notice since the last take, and whether the record must be read."""
        self.clear()
        with self._lock:
            notice, reread = self._notice, self._reread
            self._notice, self._reread = None, False
        return notice, reread


class Notifier:
    """The sync client's subscription: one thread, shared by every waiting thread."""

    def __init__(self, client: redis.Redis, *channels: str) -> None:
        self.client = client
        #: One channel, or one per ledger cell (cells mode): subscribed together.
        self.channels = channels
        self._confirmed = 0
        self._watch: dict[str, set[Wake]] = defaultdict(set)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, ref: str) -> Wake:
        ev = Wake(self._lock)
        with self._lock:
            self._watch[ref].add(ev)
            if self._thread is None or not self._thread.is_alive():
                self._ready.clear()
                self._thread = threading.Thread(target=self._run, name="toolq-notify", daemon=True)
                self._thread.start()
        # A notification sent before the subscription exists would be missed:
        # callers read the record after this returns, so wait for it.
        self._ready.wait(5.0)
        return ev

    def unwatch(self, ref: str, ev: Wake) -> None:
        with self._lock:
            events = self._watch.get(ref)
            if events is not None:
                events.discard(ev)
                if not events:
                    del self._watch[ref]

    def watching(self) -> int:
        with self._lock:
            return sum(len(events) for events in self._watch.values())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3.0)

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._watch.values():
                for ev in events:
                    ev.put(None)

    def _dispatch(self, text: str) -> None:
        ref = notice_ref(text)
        with self._lock:
            events = self._watch.get(ref)
            if not events:
                return
            event = to_event(text)
            for ev in events:
                ev.put(event)

    def _run(self) -> None:
        sub = Subscription(self.client, self.channels)
        try:
            while not self._stop.is_set():
                try:
                    msg = sub.get_message(timeout=0.5)
                    if msg is not None:
                        self._heard(msg)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    log.debug("notification subscription lost; subscribing again")
                    self._ready.set()  # watchers read (and fail) rather than wait for it
                    self._stop.wait(0.2)
        finally:
            sub.close()

    def _heard(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "message":
            self._dispatch(_text(msg["data"]))
        elif msg.get("type") == "subscribe":
            # The server confirms each subscription, also the one redis-py makes by
            # itself after reconnecting: from now on nothing is missed, but what
            # was published meanwhile is gone, so every waiter reads again. One
            # confirmation per channel: ready once every channel is confirmed.
            self._confirmed += 1
            if self._confirmed > len(self.channels):
                self._wake_all()
            if self._confirmed >= len(self.channels):
                self._ready.set()


# --------------------------------------------------------------------------- the async subscriber


class Waiter:
    """One ``tq.aio`` wait or watch: the events heard for its ref since it last looked.

    Small on purpose, since thousands can be pending on one loop: a list and a
    future made only while it sleeps (no asyncio.Event, whose deque alone is
    larger than the rest).
    """

    __slots__ = ("_items", "_reread", "_wakeup", "progress")

    def __init__(self, progress: bool) -> None:
        self._items: list[Event] = []
        self._reread = False
        self._wakeup: asyncio.Future[None] | None = None
        #: Whether progress events are kept (a wait without on_progress drops them).
        self.progress = progress

    def put(self, event: Event | None) -> None:
        if event is None or len(self._items) >= WAITER_BACKLOG:
            self._items = []
            self._reread = True
        elif event.kind == "progress" and not self.progress:
            return
        else:
            self._items.append(event)
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """Until something was heard (True) or ``timeout`` seconds passed (False)."""
        if self._items or self._reread:
            return True
        self._wakeup = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._wakeup
        except TimeoutError:
            return False
        finally:
            self._wakeup = None
        return True

    @property
    def asleep(self) -> bool:
        return self._wakeup is not None

    def take(self) -> tuple[list[Event], bool]:
        """The events heard, oldest first, and whether the record must be read (some lost)."""
        items, reread = self._items, self._reread
        self._items = []
        self._reread = False
        return items, reread


class AsyncNotifier:
    """``tq.aio``'s subscription on one event loop: one task, shared by every waiter on it.

    It holds one connection (a Cluster: one per primary, ``client`` being a
    ``redis.asyncio.cluster.RedisCluster``; :class:`AsyncSubscription`),
    subscribed to ``channel`` (settled states) from the first watch on, and to
    ``steps_channel`` (every other state, and progress) from the first watch that
    wants those.
    """

    def __init__(
        self,
        client: aioredis.Redis | AsyncRedisCluster,
        channel: str | Sequence[str],
        steps_channel: str | Sequence[str],
    ) -> None:
        self.client = client
        #: One channel of each kind, or one per ledger cell (cells mode).
        self.channels = (channel,) if isinstance(channel, str) else tuple(channel)
        self.steps_channels = (
            (steps_channel,) if isinstance(steps_channel, str) else tuple(steps_channel)
        )
        self._watch: dict[str, set[Waiter]] = {}
        self._ready = asyncio.Event()
        self._steps_ready = asyncio.Event()
        self._want_steps = False
        self._sub: AsyncSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        #: Confirmed subscriptions to ``channel``: the first, then one per re-subscription.
        self.subscriptions = 0
        self._steps_subscriptions = 0

    async def watch(self, ref: str, *, progress: bool = False) -> Waiter:
        """Register interest in ``ref`` (with every state and progress: ``progress``).

        Returns once the subscription is confirmed: the caller reads the record
        next, and a notice published before the subscription would be missed.
        Bounded: if the server is away, the read says so.
        """
        w = Waiter(progress)
        self._watch.setdefault(ref, set()).add(w)
        if self._task is None or self._task.done():
            self._ready.clear()
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="toolq-aio-notify")
        try:
            if progress:
                self._want_steps = True
                await self._subscribe_steps()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._ready.wait()
                    if progress:
                        await self._steps_ready.wait()
        except BaseException:  # cancelled meanwhile: the caller never got the waiter
            self.unwatch(ref, w)
            raise
        return w

    def unwatch(self, ref: str, w: Waiter) -> None:
        waiters = self._watch.get(ref)
        if waiters is not None:
            waiters.discard(w)
            if not waiters:
                del self._watch[ref]

    def watching(self) -> int:
        return sum(len(w) for w in self._watch.values())

    def sleeping(self) -> int:
        """Waiters parked until a notice (their first read done), for measurements."""
        return sum(w.asleep for waiters in self._watch.values() for w in waiters)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _subscribe_steps(self) -> None:
        """Add the steps channels to the subscription (once: it keeps them)."""
        sub = self._sub
        if sub is None:
            return  # not started: the subscription starts with them
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, OSError):
            await sub.add(*self.steps_channels)  # else subscribed with the next placing
        _cancelled_meanwhile()

    def _wake_all(self, steps_only: bool = False) -> None:
        for waiters in self._watch.values():
            for w in waiters:
                if w.progress or not steps_only:
                    w.put(None)

    def _dispatch(self, text: str) -> None:
        waiters = self._watch.get(notice_ref(text))
        if not waiters:
            return
        event = to_event(text)
        for w in waiters:
            w.put(event)

    async def _run(self) -> None:
        pause = 0.1
        channels = (*self.channels, *self.steps_channels) if self._want_steps else self.channels
        sub = self._sub = AsyncSubscription(self.client, channels)
        try:
            heard = 0
            while True:
                try:
                    msg = await sub.get_message(timeout=30.0)  # may send a health check
                    _cancelled_meanwhile()
                    if msg is None:
                        continue
                    self._heard(msg)
                    pause = 0.1
                    heard += 1
                    if heard % DISPATCH_PER_PASS == 0:
                        # Buffered notices are read without the loop getting a turn:
                        # let it run (and the waiters just woken) between batches.
                        await asyncio.sleep(0)
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    log.debug("notification subscription lost; subscribing again")
                    self._ready.set()  # watchers read (and fail) rather than wait for it
                    self._steps_ready.set()
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
        finally:
            self._sub = None
            await sub.aclose()

    def _heard(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "message":
            self._dispatch(_text(msg["data"]))
        elif msg.get("type") == "subscribe":
            # Confirmed, also after redis-py re-subscribed by itself: what was
            # published while the connection was down is gone, so read again.
            # One confirmation per channel: ready once every channel is confirmed.
            if _text(msg.get("channel")) in self.steps_channels:
                self._steps_subscriptions += 1
                if self._steps_subscriptions > len(self.steps_channels):
                    self._wake_all(steps_only=True)
                if self._steps_subscriptions >= len(self.steps_channels):
                    self._steps_ready.set()
            else:
                self.subscriptions += 1
                if self.subscriptions > len(self.channels):
                    self._wake_all()
                if self.subscriptions >= len(self.channels):
                    self._ready.set()


def _cancelled_meanwhile() -> None:
    """Raise the cancellation of the current task that a redis-py send swallowed
    (Python 3.11's asyncio.wait_for; see toolq.ledger.aio.AsyncLedger._command)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
