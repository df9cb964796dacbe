"""Who is serving: worker heartbeats per queue, and what a submit warns about.

A submit to a server where nothing serves the tool's queue used to sit
``queued`` with no word (a client and its workers on different servers is the
usual cause). Now:

- **Workers beat.** The main process of every Celery worker on a toolq app
  writes, every :data:`BEAT_S`, the time into one ledger hash
  (:attr:`toolq.keys.Keys.workers`): one field per queue it consumes, so the
  field holds the latest beat of any worker on that queue. It starts on
  Celery's ``worker_ready`` signal, so ``toolq worker`` and a plain
  ``celery -A module:celery_app worker`` both beat; it stops with the worker
  (a killed one just stops beating). Schedulers already beat into
  :attr:`~toolq.keys.Keys.schedulers`.
- **Submits read it, rarely.** :class:`Liveness` keeps what it last read and
  reads again (one pipeline: the two hashes) at most every
  :data:`CHECK_EVERY_S` per process: a submit costs one extra round trip every
  few seconds, not one each. The warnings are advisory
  (``Submission.warnings``): they never change an operation's state.
- ``toolq status`` shows each queue's last beat and "no live worker".

A beat older than :data:`ALIVE_MS` counts as no beat, as for schedulers
(``toolq.monitor.SCHEDULER_ALIVE_MS``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from celery import signals

log = logging.getLogger("toolq.liveness")

#: Seconds between a worker's beats.
BEAT_S = 5.0
#: A worker or scheduler beat older than this (ms) is not live: three beats missed.
ALIVE_MS = 15_000
#: A process reads the beats again at most this often (seconds) for its submits.
CHECK_EVERY_S = 5.0


def assess(
    queue: str, worker_beat_ms: int | None, scheduler_beats_ms: Iterable[int], now_ms: int
) -> tuple[str, ...]:
    """The warnings for a call on ``queue`` given the beats read. Pure."""
    out = []
    if worker_beat_ms is None or now_ms - worker_beat_ms > ALIVE_MS:
        out.append(
            f"no live worker for queue {queue} (none seen in the last {ALIVE_MS // 1000} s): "
            "the call waits until one runs (`toolq worker --app ...` against this server)"
        )
    if not any(now_ms - beat <= ALIVE_MS for beat in scheduler_beats_ms):
        out.append(
            "no live scheduler: retries, verification and recovery of lost messages wait "
            "until one runs (`toolq scheduler --app ...` against this server)"
        )
    return tuple(out)


def worker_beats(raw: Mapping[Any, Any]) -> dict[str, int]:
    """The workers hash as read: queue -> last beat (ms)."""
    return {_s(k): int(float(v)) for k, v in raw.items()}


class Liveness:
    """What a process last read of the beats, read again when older than ``every``.

    Thread-safe. The sync client calls :meth:`check`; the async one reads the
    same two keys itself when :meth:`due` and hands them to :meth:`update`.
    """

    def __init__(
        self,
        workers_key: str,
        schedulers_key: str,
        *,
        clock: Callable[[], float] = time.time,
        every: float = CHECK_EVERY_S,
    ) -> None:
        self.workers_key = workers_key
        self.schedulers_key = schedulers_key
        self.clock = clock
        self.every = every
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._workers: dict[str, int] = {}
        self._schedulers: list[int] = []
        self._said: set[str] = set()

    def due(self) -> bool:
        with self._lock:
            return self._read_at is None or self.clock() - self._read_at >= self.every

    def update(self, workers: Mapping[Any, Any], schedulers: Iterable[Any]) -> None:
        with self._lock:
            self._workers = worker_beats(workers)
            self._schedulers = [int(float(v)) for v in schedulers]
            self._read_at = self.clock()

    def warnings(self, queue: str) -> tuple[str, ...]:
        """From what was last read (nothing read yet: none)."""
        with self._lock:
            if self._read_at is None:
                return ()
            found = assess(
                queue, self._workers.get(queue), self._schedulers, int(self.clock() * 1000)
            )
            fresh = [w for w in found if w not in self._said]
            self._said = set(found)  # said again once it was fixed and came back
        for w in fresh:
            log.warning("%s", w)
        return found

    def check(self, client: redis.Redis, queue: str) -> tuple[str, ...]:
        """The warnings for ``queue``; reads the beats first when due. Never raises
        for a read that fails (advisory): the last known answer, or none."""
        if self.due():
            try:
                pipe = client.pipeline(transaction=False)
                pipe.hgetall(self.workers_key)
                pipe.hvals(self.schedulers_key)
                workers, schedulers = pipe.execute()
            except redis.RedisError as exc:
                log.debug("worker beats not read: %s", type(exc).__name__)
            else:
                self.update(workers, schedulers)
        return self.warnings(queue)

    async def acheck(self, client: aioredis.Redis, queue: str) -> tuple[str, ...]:
        """:meth:`check` for ``tq.aio``: the same cache, read without blocking the loop."""
        if self.due():
            try:
                pipe = client.pipeline(transaction=False)
                pipe.hgetall(self.workers_key)
                pipe.hvals(self.schedulers_key)
                workers, schedulers = await pipe.execute()
            except redis.RedisError as exc:
                log.debug("worker beats not read: %s", type(exc).__name__)
            else:
                self.update(workers, schedulers)
        return self.warnings(queue)


# --------------------------------------------------------------------------- the worker side


class Heartbeat:
    """A worker main process's beat: one thread, one HSET every ``every`` seconds."""

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        key: str,
        queues: Sequence[str],
        *,
        every: float = BEAT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.key = key
        self.queues = tuple(queues)
        self.every = every
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="toolq-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        now = int(self.clock() * 1000)
        self.client().hset(self.key, mapping=dict.fromkeys(self.queues, now))

    def _loop(self) -> None:
        while True:
            try:
                self.beat()
            except redis.RedisError as exc:  # the server is away: beat again next time
                log.debug("heartbeat not written: %s", type(exc).__name__)
            if self._stop.wait(self.every):
                return


_beats: dict[int, Heartbeat] = {}


def install() -> None:
    """Beat from every worker on a toolq app (``celery.toolq_app``). Idempotent."""
    signals.worker_ready.connect(_on_ready, weak=False, dispatch_uid="toolq.liveness.ready")
    signals.worker_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="toolq.liveness.stop")


def _on_ready(sender: Any = None, **_: Any) -> None:
    celery = getattr(sender, "app", None)
    app = getattr(celery, "toolq_app", None)
    if app is None:
        return
    consumer = getattr(sender, "task_consumer", None)
    queues = [q.name for q in getattr(consumer, "queues", None) or ()]
    if not queues:
        q = app.settings.queues
        queues = [q.calls, q.verify]
    _beats[id(celery)] = Heartbeat(lambda: app.redis, app.ledger.keys.workers, queues).start()


def _on_shutdown(sender: Any = None, **_: Any) -> None:
    beat = _beats.pop(id(getattr(sender, "app", None)), None)
    if beat is not None:
        beat.stop()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
