"""Wake waiters on ledger transitions: one Pub/Sub subscription per process.

``tq.wait`` registers interest in a ref, reads the record once, then sleeps
on an event the subscriber thread sets when a transition of that ref is
published. No polling loop, no Redis round trip while it waits.

A notice (published by the ledger scripts, :mod:`toolq.ledger.scripts`) reads
``"state ref\nrev\nenvelope"``: the waiter takes the envelope from it when its
revision is newer than the one it read, so a settled call costs no second read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass

import redis

log = logging.getLogger("toolq.notify")


@dataclass(frozen=True)
class Notice:
    """What the ledger published for one transition into a settled state."""

    state: str
    rev: int
    #: The envelope JSON the transition wrote; "" when it wrote none.
    envelope: str


def parse_notice(text: str) -> tuple[str, Notice | None]:
    """``(ref, notice)``; the notice is None when the text carries no revision."""
    head, _, rest = text.partition("\n")
    state, _, ref = head.partition(" ")
    rev, _, envelope = rest.partition("\n")
    if not rev.isdigit():
        return ref, None
    return ref, Notice(state, int(rev), envelope)


class Wake(threading.Event):
    """Set when a transition of the watched ref is published (or the subscription
    was lost, with no notice: read the record again)."""

    def __init__(self) -> None:
        super().__init__()
        self.notice: Notice | None = None


class Notifier:
    def __init__(self, client: redis.Redis, channel: str) -> None:
        self.client = client
        self.channel = channel
        self._watch: dict[str, set[Wake]] = defaultdict(set)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscribed_before = False

    def watch(self, ref: str) -> Wake:
        ev = Wake()
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

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3.0)

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._watch.values():
                for ev in events:
                    ev.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.channel)
                # The subscribe reply confirms the subscription before anyone reads.
                pubsub.get_message(timeout=1.0)
                self._ready.set()
                if self._subscribed_before:
                    self._wake_all()  # anything missed while reconnecting is re-read
                self._subscribed_before = True
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.5)
                    if msg is None or msg.get("type") != "message":
                        continue
                    data = msg["data"]
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    ref, notice = parse_notice(text)
                    with self._lock:
                        for ev in self._watch.get(ref, ()):
                            ev.notice = notice
                            ev.set()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                log.debug("notification subscription lost; reconnecting")
                self._ready.set()
                self._wake_all()
                self._stop.wait(0.2)
            finally:
                with contextlib.suppress(Exception):  # closing a broken connection
                    pubsub.close()
