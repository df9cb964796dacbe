"""Who is serving: worker heartbeats per queue, and what a submit warns about.

A submit to a server where nothing serves the tool's queue used to sit
``queued`` with no word (a client and its workers on different servers is the
usual cause). Now:

- **Workers beat.** The main process of every Celery worker on a toolq app
  writes, every :data:`BEAT_S`, the time into one ledger hash
  (:attr:`toolq.core.keys.Keys.workers`): one field per queue it consumes, so the
  field holds the latest beat of any worker on that queue. In the same round
  trip it writes its own entry (:class:`WorkerNode`: node name, pid, pool,
  concurrency, queues, last beat) into :attr:`toolq.core.keys.Keys.worker_nodes`,
  which ``toolq status`` and the console read to count live workers without
  a Celery control broadcast (a ping waits out its whole timeout, 0.5-1 s, for
  answers that may never come). It starts on Celery's ``worker_ready``
  signal, so ``toolq worker`` and a plain ``celery -A module:celery_app
  worker`` both beat; a worker that stops removes its entry, a killed one
  just stops beating (entries silent for :data:`FORGET_NODE_MS` are removed by
  the next worker that starts, and shown as not live until then). Schedulers already beat into
  :attr:`~toolq.core.keys.Keys.schedulers`.
- **Submits read it, rarely.** :class:`Liveness` keeps what it last read and
  reads again (one pipeline: the two hashes) at most every
  :data:`CHECK_EVERY_S` per process: a submit costs one extra round trip every
  few seconds, not one each. The warnings are advisory
  (``Submission.warnings``): they never change an operation's state.
- ``toolq status`` shows each queue's last beat and "no live worker".

A beat older than :data:`ALIVE_MS` counts as no beat, as for schedulers
(``toolq.edges.monitor.SCHEDULER_ALIVE_MS``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from toolq.core.text import as_text

log = logging.getLogger("toolq.liveness")

#: Seconds between a worker's beats.
BEAT_S = 5.0
#: A worker or scheduler beat older than this (ms) is not live: three beats missed.
ALIVE_MS = 15_000
#: A process reads the beats again at most this often (seconds) for its submits.
CHECK_EVERY_S = 5.0
#: A worker entry silent this long (ms) is forgotten: an hour of a killed worker's
#: last word is enough to tell what happened to it.
FORGET_NODE_MS = 3_600_000


@dataclass(frozen=True)
class WorkerNode:
    """One worker main process, as its beat describes it (JSON in the nodes hash)."""

    node: str
    pid: int
    pool: str
    concurrency: int
    queues: tuple[str, ...]
    started_ms: int
    beat_ms: int = 0
    #: What it waits for, when it does (:meth:`toolq.process.waiting.Outage.beat`):
    #: ``{"for": "broker", "since": ms}``.
    waiting: dict[str, Any] | None = None

    @property
    def field(self) -> str:
        """Its field in the nodes hash: the node name and pid (two workers started
        without ``-n`` on one host share Celery's default name, ``celery@host``)."""
        return f"{self.node}#{self.pid}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerNode | None:
        """The entry as written; None for one this version cannot read."""
        try:
            d = json.loads(raw)
            return cls(
                node=str(d["node"]),
                pid=int(d["pid"]),
                pool=str(d["pool"]),
                concurrency=int(d["concurrency"]),
                queues=tuple(str(q) for q in d["queues"]),
                started_ms=int(d["started_ms"]),
                beat_ms=int(d["beat_ms"]),
                waiting=waiting_of(d.get("waiting")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def waiting_of(raw: Any) -> dict[str, Any] | None:
    """A beat's ``waiting`` as written (``{"for": str, "since": ms}``), or None."""
    if not isinstance(raw, dict):
        return None
    try:
        return {"for": str(raw["for"]), "since": int(raw["since"])}
    except (KeyError, TypeError, ValueError):
        return None


def worker_nodes(raw: Mapping[Any, Any]) -> list[WorkerNode]:
    """The nodes hash as read, by node name and pid."""
    found = (WorkerNode.from_json(v) for v in raw.values())
    return sorted((n for n in found if n is not None), key=lambda n: (n.node, n.pid))


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
    return {as_text(k): int(float(v)) for k, v in raw.items()}


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
        #: The last outage of the server this process saw (:meth:`away`): its first
        #: and its last failure (s).
        self._away_since: float | None = None
        self._away_last: float | None = None

    def due(self) -> bool:
        with self._lock:
            return self._read_at is None or self.clock() - self._read_at >= self.every

    def update(self, workers: Mapping[Any, Any], schedulers: Iterable[Any]) -> None:
        with self._lock:
            self._workers = worker_beats(workers)
            self._schedulers = [int(float(v)) for v in schedulers]
            self._read_at = self.clock()

    def away(self) -> None:
        """The server did not answer this process. No process's beat reaches it
        meanwhile, so for :data:`ALIVE_MS` after the last such failure the beats are
        judged as of the outage's start: a worker live when the server went away is
        not "no live worker" in the seconds before its first beat after it came back."""
        with self._lock:
            now = self.clock()
            if self._away_last is None or now - self._away_last > ALIVE_MS / 1000:
                self._away_since = now
            self._away_last = now

    def _as_of_ms(self) -> int:
        now = self.clock()
        last, since = self._away_last, self._away_since
        if last is not None and since is not None and now - last < ALIVE_MS / 1000:
            return int(min(now, since) * 1000)
        return int(now * 1000)

    def warnings(self, queue: str) -> tuple[str, ...]:
        """From what was last read (nothing read yet: none)."""
        with self._lock:
            if self._read_at is None:
                return ()
            found = assess(queue, self._workers.get(queue), self._schedulers, self._as_of_ms())
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
                self.away()
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
                self.away()
            else:
                self.update(workers, schedulers)
        return self.warnings(queue)


# --------------------------------------------------------------------------- the worker side


class Heartbeat:
    """A worker main process's beat: one thread, one round trip every ``every`` seconds.

    With ``node`` and ``nodes_key``, the beat also writes the worker's own entry.
    """

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        key: str,
        queues: Sequence[str],
        *,
        every: float = BEAT_S,
        clock: Callable[[], float] = time.time,
        node: WorkerNode | None = None,
        nodes_key: str | None = None,
        waiting: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        self.client = client
        self.key = key
        self.queues = tuple(queues)
        self.every = every
        self.clock = clock
        self.node = node
        self.nodes_key = nodes_key
        self.waiting = waiting
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="toolq-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating; a worker that stops cleanly takes its entry out at once."""
        self._stop.set()
        if self.node is not None and self.nodes_key is not None:
            try:
                self.client().hdel(self.nodes_key, self.node.field)
            except redis.RedisError as exc:
                log.debug("worker entry not removed: %s", type(exc).__name__)

    def beat(self) -> None:
        now = int(self.clock() * 1000)
        if self.node is None or self.nodes_key is None:
            self.client().hset(self.key, mapping=dict.fromkeys(self.queues, now))
            return
        entry = WorkerNode(**{**asdict(self.node), "beat_ms": now, "waiting": self.waiting()})
        pipe = self.client().pipeline(transaction=False)
        pipe.hset(self.key, mapping=dict.fromkeys(self.queues, now))
        pipe.hset(self.nodes_key, self.node.field, entry.to_json())
        pipe.execute()

    def forget_silent(self) -> None:
        """Remove the entries of workers silent for :data:`FORGET_NODE_MS` (killed ones)."""
        if self.nodes_key is None:
            return
        client = self.client()
        cutoff = int(self.clock() * 1000) - FORGET_NODE_MS
        silent = [
            n.field for n in worker_nodes(client.hgetall(self.nodes_key)) if n.beat_ms < cutoff
        ]
        if silent:
            client.hdel(self.nodes_key, *silent)

    def _loop(self) -> None:
        try:
            self.forget_silent()
        except redis.RedisError as exc:
            log.debug("silent worker entries not read: %s", type(exc).__name__)
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
    from celery import signals  # here: ``toolq status`` reads the beats without Celery

    signals.worker_ready.connect(
        _on_ready, weak=False, dispatch_uid="toolq.adapters.liveness.ready"
    )
    signals.worker_shutdown.connect(
        _on_shutdown, weak=False, dispatch_uid="toolq.adapters.liveness.stop"
    )


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
    pool = getattr(sender, "pool", None)
    node = WorkerNode(
        node=str(getattr(sender, "hostname", "") or f"pid-{os.getpid()}"),
        pid=os.getpid(),
        pool=_pool_name(pool),
        concurrency=int(getattr(pool, "limit", 0) or 0),
        queues=tuple(queues),
        started_ms=int(time.time() * 1000),
    )
    keys = app.ledger.keys

    def waiting() -> dict[str, Any] | None:
        outage = getattr(sender, "toolq_broker", None)  # the sender is the consumer
        return None if outage is None else outage.beat()

    beat = Heartbeat(
        lambda: app.redis,
        keys.workers,
        queues,
        every=app.settings.worker.beat_s,
        node=node,
        nodes_key=keys.worker_nodes,
        waiting=waiting,
    )
    _beats[id(celery)] = beat.start()


def _pool_name(pool: Any) -> str:
    """``prefork``, ``threads``, ``solo``, ...: the name ``-P`` gives the pool's class."""
    if pool is None:
        return ""
    alias = getattr(type(pool), "alias", None)  # a pool Celery does not list (asyncio)
    if isinstance(alias, str):
        return alias
    from celery import concurrency

    # alias -> "module:Class", as -P reads it (looked up by name: nothing is imported)
    aliases: dict[str, Any] = getattr(concurrency, "ALIASES", {})
    where = f"{type(pool).__module__}:{type(pool).__name__}"
    return next((alias for alias, path in aliases.items() if path == where), where)


def _on_shutdown(sender: Any = None, **_: Any) -> None:
    beat = _beats.pop(id(getattr(sender, "app", None)), None)
    if beat is not None:
        beat.stop()
