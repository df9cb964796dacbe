"""Lease renewal: one background thread per worker process renews, in one
script call, every lease the process holds, while its tools run."""

from __future__ import annotations

import contextvars
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from toolq.adapters.ledger.store import Ledger

log = logging.getLogger("toolq.leases")

_HOST = socket.gethostname()


def process_holder() -> str:
    """This process's id: host, pid and a token against pid reuse."""
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_dead(holder: str) -> bool:
    """True when ``holder`` is a process on this host that no longer runs.

    A holder on another host cannot be checked from here: its lease expiry
    decides (the scheduler's lease sweep).
    """
    parts = holder.split(":")
    if len(parts) < 3 or parts[0] != _HOST:
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def until_next(sent_at: float, every: float, now: float) -> float:
    """Seconds to wait before the next renewal: ``every`` after the last one was *sent*.

    A renewal's lease counts from when it was sent (its ``now``), not from its reply:
    waiting ``every`` after a reply that took ``d`` left a lease of ``lease - every - d``
    to the next one, so a server stalled for two thirds of a lease (an fsync) lost it.
    Counted from the send, a renewal follows a slow one at once: a stall shorter than
    the whole lease keeps it.
    """
    return max(0.0, sent_at + every - now)


class RenewalWord:
    """What the renewals say while the server is away: once when they start failing,
    once when they are back (not every period: a two-minute outage said it 24 times).

    "Back" is said on the keeper's next answer from the server: a renewal, or, when no
    lease is left to renew (the calls held then have ended or were given back), a
    ping the keeper sends only while failing (:meth:`idle`). Without it an outage that
    ended with nothing held never said "back", and the next outage's failures said
    nothing at all."""

    __slots__ = ("failing",)

    def __init__(self) -> None:
        self.failing = False

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            self.failing = True
            log.warning("lease renewals failing (%s); retrying", type(exc).__name__)

    def renewed(self) -> None:
        if self.failing:
            self.failing = False
            log.warning("lease renewals back")

    def idle(self, ping: Callable[[], object]) -> None:
        """Nothing held to renew: while failing, ask the server (``ping``); its answer
        is the renewals' "back". Still away: nothing said, the next period asks again."""
        if self.failing:
            with self.asking():
                ping()

    @contextmanager
    def asking(self) -> Iterator[None]:
        """Around the ping :meth:`idle` sends (the asyncio keeper awaits its own inside):
        an answer is the "back"; a redis error, the server still away, says nothing."""
        try:
            yield
        except redis.RedisError:
            return
        self.renewed()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class LeaseKeeper:
    def __init__(
        self,
        ledger: Ledger,
        lease_ms: int,
        clock: Callable[[], float],
        *,
        renew_every: float,
        ticks: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.lease_ms = lease_ms
        #: Seconds between renewals: ``LeaseSettings.renew_every``, passed in by the App.
        self.renew_every = renew_every
        self.clock = clock
        self._ticks = ticks  # what the renewals are paced by (a test's own clock)
        self._word = RenewalWord()
        self.holder = process_holder()
        self._seq = itertools.count(1)
        self._held: dict[tuple[str, int, str, str], int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stop = threading.Event()

    def _ensure(self) -> None:
        if self._pid != os.getpid():  # forked: a new process holds nothing yet
            self.holder = process_holder()
            self._seq = itertools.count(1)
            self._held = {}
            self._lock = threading.Lock()
            self._thread = None
            self._pid = os.getpid()
            self._stop = threading.Event()
        if self._thread is None or not self._thread.is_alive():
            # An empty context (as a thread's is by default, made explicit): the keeper's
            # lines are about no one operation, not the one whose call started it.
            self._thread = threading.Thread(
                target=contextvars.Context().run,
                args=(self._loop,),
                name="toolq-leases",
                daemon=True,
            )
            self._thread.start()

    def new_holder(self) -> str:
        """A lease-holder id for one delivery: this process's id and a sequence number.

        Per delivery, not per process, so that two deliveries of one message to
        two threads of one process are told apart by the claim.
        """
        with self._lock:
            self._ensure()
            return f"{self.holder}:{next(self._seq)}"

    @contextmanager
    def hold(self, ref: str, attempt: int, kind: str, holder: str) -> Iterator[None]:
        with self._lock:
            self._ensure()
            key = (ref, attempt, kind, holder)
            self._held[key] = self._held.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        every = self.renew_every
        sent = self._ticks()
        while not self._stop.wait(until_next(sent, every, self._ticks())):
            sent = self._ticks()
            with self._lock:
                held = list(self._held)
            try:
                if not held:
                    self._word.idle(self.ledger.redis.ping)
                    continue
                lost = self.ledger.renew(int(self.clock() * 1000), self.lease_ms, held)
            except redis.RedisError as exc:
                self._word.failed(exc)
                self._stop.wait(min(every, 0.5))  # not a hot loop while the server is away
                continue
            except Exception:  # never end the renewals of the calls held (as the asyncio keeper)
                log.exception("lease renewal failed; retrying")
                self._stop.wait(min(every, 0.5))
                continue
            self._word.renewed()
            for ref in lost:
                log.warning("lease lost for %s: the operation moved on without this worker", ref)
