"""The sync client's notifier: one thread per process, settled states only."""

from __future__ import annotations

import logging
import threading

import redis

from toolq.adapters.notify.dispatch import Dispatch
from toolq.adapters.notify.format import Event
from toolq.adapters.notify.subscription import Subscription

log = logging.getLogger("toolq.notify")


class Wake(threading.Event):
    """Set when a transition of the watched ref is published, or when the subscription
    came back after a loss (``reread``: notices may have been missed)."""

    #: A sync wait hears settled states only.
    progress = False

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
    """The sync client's subscription: one thread, shared by every waiting thread.

    ``subscription``: :class:`Subscription` on one server, ``ShardedSubscription``
    on a Cluster (the caller knows which: :mod:`toolq.topology.notices`).
    """

    def __init__(
        self, client: redis.Redis, *channels: str, subscription: type[Subscription] = Subscription
    ) -> None:
        self.client = client
        #: One channel, or one per ledger cell (cells mode): subscribed together.
        self.channels = channels
        self.subscription = subscription
        self._dispatch: Dispatch[Wake] = Dispatch(channels)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, ref: str) -> Wake:
        ev = Wake(self._lock)
        with self._lock:
            self._dispatch.add(ref, ev)
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
            self._dispatch.discard(ref, ev)

    def watching(self) -> int:
        with self._lock:
            return self._dispatch.count()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3.0)

    def _run(self) -> None:
        sub = self.subscription(self.client, self.channels)
        try:
            while not self._stop.is_set():
                try:
                    msg = sub.get_message(timeout=0.5)
                    if msg is None:
                        continue
                    with self._lock:
                        group = self._dispatch.heard(msg)
                    if group is not None and group.ready:
                        self._ready.set()
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    log.debug("notification subscription lost; subscribing again")
                    self._ready.set()  # watchers read (and fail) rather than wait for it
                    self._stop.wait(0.2)
        finally:
            sub.close()
