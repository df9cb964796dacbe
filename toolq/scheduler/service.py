"""The scheduler service: owns every delay, jitter and attempt count.

Not Celery beat and not countdown/ETA. Operations wait in a Redis sorted set
scored by the time the scheduler must next look at them. A loop takes due
items in batches (one script call), decides what each needs with the pure
:func:`~toolq.recovery.policy.decide`, and applies the transitions in one
more script call that also publishes their Celery messages, so a crash
between "decided" and "published" cannot lose or double a dispatch.

Several schedulers may run at once: a batch one of them took is hidden from
the others for ``hold`` seconds, and every transition is a compare-and-set on
the record's revision, so a race ends in one dispatch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis
from redis.exceptions import NoScriptError, TryAgainError

from toolq import errors
from toolq.broker.app import transport_options
from toolq.broker.depth import Depths
from toolq.broker.messages import message_head
from toolq.ledger import Ledger, outbox
from toolq.notify import ShardedSubscription
from toolq.outage import UNREACHABLE
from toolq.recovery import outcome
from toolq.recovery.actions import for_decision
from toolq.recovery.policy import (
    Action,
    Queues,
    Snapshot,
    Timeouts,
    Waiting,
    decide,
    oldest_waiting,
    sleep_seconds,
)
from toolq.recovery.transition import Transition
from toolq.scheduler.series import Sampler
from toolq.settings import ToolqSettings
from toolq.states import PENDING_RECOVERY, TERMINAL
from toolq.tools import Registry
from toolq.waiting import Outage, Waiter


class Parts(Protocol):
    """What the scheduler runs on (:class:`toolq.app.App` has all of it)."""

    settings: ToolqSettings
    registry: Registry
    clock: Callable[[], float]

    @property
    def redis(self) -> redis.Redis: ...

    @property
    def redis_url(self) -> str: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def outbound(self) -> outcome.Messages: ...

    def outbound_for(self, tool: str) -> outcome.Messages: ...

    @property
    def policy(self) -> outcome.Policy: ...


log = logging.getLogger("toolq.scheduler")

#: What a round fails with while the server is away (or a Cluster's slots move).
LEDGER_DOWN: tuple[type[BaseException], ...] = (
    *UNREACHABLE,  # the server away, a Cluster's node down before its replica took over
    TryAgainError,  # keys of a cell in the middle of a slot migration
    NoScriptError,  # a drain's raw script call after SCRIPT FLUSH: loaded again
)

MAINTENANCE_EVERY_S = 60.0
#: Messages read at the front of each queue to tell how old its backlog is: past the
#: redeliveries kombu puts there, to the first message it can date.
QUEUE_HEAD = 8
#: Sleeps shorter than this are taken locally rather than in a blocking BLPOP.
SHORT_SLEEP_S = 0.1
#: Cells mode on a Cluster: one BLPOP cannot wait on the wake lists of cells on several
#: nodes. The scheduler listens to its cells' notice channels instead (a transition that
#: adds a due item announces the state it entered) and, woken by one, looks again, but
#: not sooner than this after its last look (under load notices never stop); a quiet
#: transition (no notice) is seen at the planned wake-up, at most ``max_sleep`` later.
CLUSTER_POLL_S = 0.5
#: Cells mode: schedulers share the cells, each holding a lease on its own (renewed
#: every loop, at most this often). A dead scheduler's cells are free once its leases
#: run out (:meth:`Scheduler.lease_ttl_ms`) and its beat is older than that.
LEASE_EVERY_S = 1.0


@dataclass
class TickStats:
    taken: int = 0
    applied: int = 0
    refused: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    #: publish time minus due time (ms) of each dispatch/republish/verify
    lags_ms: list[int] = field(default_factory=list)
    #: (tool, state left, ms spent in it) for operations moved out of pending recovery
    recovered: list[tuple[str, str, int]] = field(default_factory=list)


@dataclass
class _Batch:
    """One batch taken and decided, not yet applied."""

    now: int
    stats: TickStats
    transitions: list[Transition] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    left: list[tuple[str, str, int] | None] = field(default_factory=list)
    #: Cells mode: some cell had a full batch due (more is due right now).
    full: bool = False


class Scheduler:
    def __init__(
        self,
        app: Parts,
        *,
        clock: Callable[[], float] | None = None,
        on_tick: Callable[[TickStats], None] | None = None,
    ) -> None:
        self.app = app
        self.clock = clock or app.clock
        s = app.settings.scheduler
        self.batch = s.batch
        self.max_sleep = s.max_sleep
        self.hold_ms = int(s.hold * 1000)
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.on_tick = on_tick
        self._stop = threading.Event()
        #: The waits for the server, and for a round that failed unexpectedly.
        self.ledger_wait = Waiter(
            Outage("the ledger's server", "ledger"), log, clock=self.clock, stop=self._stop
        )
        self.fault_wait = Waiter(
            Outage("scheduler rounds", "fault", down="failing"),
            log,
            clock=self.clock,
            stop=self._stop,
        )
        #: Cells mode: the cells this scheduler holds the lease of (and walks).
        self.held: list[int] = []
        self._leased = -math.inf
        #: Cluster: the subscription to the held cells' notices, and its channels.
        self._notices: ShardedSubscription | None = None
        self._listening: list[str] = []
        self._beat = 0.0
        self._last_maintenance = 0.0
        # The chart's samples (toolq.scheduler.series), one per interval across schedulers.
        cells = [c.keys for c in app.ledger.every_cell()] if app.settings.cells else []
        self._series = Sampler(lambda: app.redis, app.ledger.keys, self.clock, cells=cells)
        # Blocking waits get their own connection, with a read timeout past the longest sleep.
        self._blocking: redis.Redis | None = None
        # Outbox mode: the broker's queue depths, read on a connection of its own.
        self._depths: Depths | None = None
        if app.settings.broker_url is not None:
            url = app.settings.broker_url.get_secret_value()
            self._depths = Depths(url, transport_options=transport_options(app.settings, url))

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def lease_ttl_ms(self) -> int:
        """How long a cell's lease outlives its last renewal: past the longest sleep
        between two renewals, so that a live scheduler never loses one."""
        return int((3 * self.max_sleep + 5) * 1000)

    def lease(self, force: bool = False) -> list[int]:
        """Cells mode: renew, give up or take cells' leases to hold this scheduler's share
        among the live ones (beats newer than a lease); at most every LEASE_EVERY_S."""
        now = time.monotonic()
        if self.app.ledger.cells is None or (not force and now - self._leased < LEASE_EVERY_S):
            return self.held
        self._leased = now
        ledger = self.app.ledger
        oldest = self.now_ms() - self.lease_ttl_ms
        beats = self.app.redis.hgetall(ledger.keys.schedulers)
        live = {_s(sid) for sid, beat in beats.items() if _int(beat) >= oldest} | {self.id}
        held = ledger.hold_cells(self.id, self.held, self.lease_ttl_ms, len(live))
        if held != self.held:
            log.info(
                "scheduler %s holds %d cells (%d live schedulers)", self.id, len(held), len(live)
            )
        self.held = held
        return held

    @property
    def timeouts(self) -> Timeouts:
        p = self.app.policy
        return Timeouts(p.unclaimed_after_ms, p.approval_timeout_ms, p.input_timeout_ms)

    # ------------------------------------------------------------------ one batch

    def tick(self) -> TickStats:
        """Take one batch of due items and act on it; returns what was done."""
        return self._commit(self._take())

    def _take(self) -> _Batch:
        """Claim a batch of due items (hidden from other ticks for ``hold``) and decide.

        In cells mode a batch from every cell (one pipeline), decided together; it
        counts as full (more is due now) when any cell's was."""
        now = self.now_ms()
        ledger = self.app.ledger
        if ledger.cells is None:
            return self._decide(ledger.claim_due(now, self.batch, self.hold_ms), now)
        rows: list[dict[str, str]] = []
        full = False
        held = self.lease()
        if not held:
            return _Batch(now, TickStats())
        for taken in ledger.claim_due_cells(held, now, self.batch, self.hold_ms):
            rows += taken
            full = full or len(taken) >= self.batch
        batch = self._decide(rows, now)
        batch.full = full
        return batch

    def _decide(self, rows: list[dict[str, str]], now: int) -> _Batch:
        """What each claimed item needs: the batch's transitions, not yet applied."""
        app = self.app
        batch = _Batch(now, TickStats(taken=len(rows)))
        if not rows:
            return batch
        stats = batch.stats
        policy = app.policy
        timeouts = self.timeouts
        queues = self._queue_ages(rows)
        transitions, lags, left = batch.transitions, batch.lags, batch.left
        for row in rows:
            snap = Snapshot.from_row(row)
            d = decide(snap, now, timeouts, queues)
            stats.actions[d.action] = stats.actions.get(d.action, 0) + 1
            tool = app.registry.get(snap.tool) if snap.tool in app.registry else None
            # the tool's own builders: its messages name it where Flower shows them
            messages = app.outbound_for(snap.tool)
            t = for_decision(d, snap, tool, row.get("call_id", ""), now, policy, messages)
            if t is None:
                if d.action is Action.DROP:
                    app.redis.zrem(app.ledger.keys_of(snap.ref).due, snap.ref)
                continue
            transitions.append(t)
            leaves = not t.quiet and t.to != snap.state and snap.state in PENDING_RECOVERY
            left.append((snap.tool, str(snap.state), now - snap.entered_ms) if leaves else None)
            if d.action in (Action.DISPATCH, Action.REPUBLISH, Action.VERIFY):
                lags.append(now - int(float(row.get("due_score") or now)))
            else:
                lags.append(-1)
        return batch

    def _commit(self, batch: _Batch) -> TickStats:
        """Apply a batch's transitions (one script call) and count what took."""
        return self._account(batch, self.app.ledger.apply(batch.transitions, batch.now))

    def _account(self, batch: _Batch, results: list[str]) -> TickStats:
        stats = batch.stats
        for t, res, lag, gone in zip(
            batch.transitions, results, batch.lags, batch.left, strict=True
        ):
            if res == "ok":
                stats.applied += 1
                if lag >= 0:
                    stats.lags_ms.append(lag)
                if gone is not None:
                    stats.recovered.append(gone)
            else:
                stats.refused += 1
                log.debug("%s: %s refused (now %s)", t.ref, t.to, res)
        if self.on_tick is not None and stats.taken:
            self.on_tick(stats)
        return stats

    def _queue_ages(self, rows: list[dict[str, str]]) -> Queues:
        """What the head of each queue says of its backlog (:func:`oldest_waiting`), read
        only when a queued or verifying operation is due (two round trips)."""
        if not any(r.get("state") in ("queued", "verifying") for r in rows):
            return Queues()
        q = self.app.settings.queues
        if self._depths is not None:
            return self._outbox_ages()
        heads = self.app.redis.pipeline(transaction=False)
        heads.lrange(q.calls, -QUEUE_HEAD, -1)
        heads.lrange(q.verify, -QUEUE_HEAD, -1)
        # kombu pushes on the left and takes from the right: the front is the list's end
        calls, verify = ([message_head(m) for m in reversed(raw)] for raw in heads.execute())
        refs = list(dict.fromkeys(h[0] for h in calls + verify if h[0]))
        pipe = self.app.redis.pipeline(transaction=False)
        for ref in refs:
            op = self.app.ledger.keys_of(ref).op(ref)
            pipe.hmget(op, ["attempt", "vcheck", "repubs", "published"])
        records = dict(zip(refs, pipe.execute(), strict=True))

        def waiting(head: list[tuple[str | None, int, bool]], verify: bool) -> list[Waiting]:
            out = []
            for ref, seq, redelivered in head:
                attempt, vcheck, repubs, published = records.get(ref or "", [None] * 4)
                mine = vcheck if verify else attempt
                out.append(
                    Waiting(
                        ref=ref,
                        seq=seq,
                        redelivered=redelivered,
                        record_seq=None if mine is None else _int(mine),
                        republished=not verify and _int(repubs) > 0,
                        published_ms=_int(published),
                    )
                )
            return out

        oldest_call, waiting_calls = oldest_waiting(waiting(calls, verify=False))
        oldest_verify, waiting_verify = oldest_waiting(waiting(verify, verify=True))
        return Queues(oldest_call, oldest_verify, waiting_calls, waiting_verify)

    def _outbox_ages(self) -> Queues:
        """Outbox mode: the broker's queue heads cannot be read; what is known instead is
        how many messages each queue holds and what the outbox still holds
        (:func:`toolq.recovery.policy.on_its_way`)."""
        assert self._depths is not None
        q = self.app.settings.queues
        oldest = outbox.oldest_of(self.app.redis, self.app.ledger.every_cell())
        depths = self._depths.read((q.calls, q.verify))
        return Queues(
            opaque=True,
            calls_depth=depths[q.calls],
            verify_depth=depths[q.verify],
            oldest_outbox_ms=oldest,
        )

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Run until :meth:`stop`. Never ends on its own: the server away (for any
        time), or a round failing unexpectedly, is waited out with a capped backoff
        (:mod:`toolq.waiting`), one log line when the wait starts and one when it ends."""
        log.info("scheduler %s started on %s", self.id, self.app.settings.safe_url)
        while not self._stop.is_set():
            try:
                self._round()
                self.ledger_wait.answered()
                self.fault_wait.answered()
            except LEDGER_DOWN as exc:
                self._drop_notices()  # subscribed again on the next sleep
                self.ledger_wait.failed(exc)
            except errors.RequestRefused:
                # On a ledger moved into cells, a scheduler without TOOLQ_CELLS would
                # find nothing due, ever: a misconfiguration is said, not waited out.
                raise
            except Exception as exc:
                self._drop_notices()
                self.fault_wait.failed(exc, traceback=True)
        log.info("scheduler %s stopped", self.id)

    def _round(self) -> None:
        """One batch taken and applied, or a drain of many; then beat and sleep."""
        if not self.app.ledger.cells_checked:
            self.app.ledger.record_cells()
        batch = self._take()
        cells = self.app.ledger.cells is not None
        # More is due right now (cells: some cell's batch was full; the drain's raw
        # connections reach one server only, so cells commit batch by batch).
        more = batch.full if cells else batch.stats.taken >= self.batch
        if more and cells:
            self._commit(batch)
            self._heartbeat_every_s(1.0)
        elif more:
            self._drain(batch)
        else:
            self._commit(batch)
            self._heartbeat()
            self._series.maybe()
            self._maintain()
            self._sleep()

    def _drain(self, batch: _Batch) -> None:
        """Many items due at once: keep the server and this process busy together.

        Each round sends batch N's APPLY and the claim of batch N+2, then decides
        batch N+1 while the server runs them (two connections of its own, one
        thread). Batches never share an item: a claimed one is held, hidden from
        later claims, until its batch is applied or the hold runs out. Ends when
        a claim comes back short; any error leaves held items to reappear after
        the hold, and their transitions are compare-and-sets, so nothing doubles.
        """
        ledger = self.app.ledger
        ledger.load_scripts()
        pool = self.app.redis.connection_pool
        applying, claiming = pool.get_connection(), pool.get_connection()
        clean = False
        beat = time.monotonic()
        try:
            claimed_at = self.now_ms()
            ledger.send_claim_due(claiming, claimed_at, self.batch, self.hold_ms)
            while True:
                ledger.send_apply(applying, batch.transitions, batch.now)
                rows, now = ledger.read_claim_due(claiming), claimed_at
                more = len(rows) >= self.batch and not self._stop.is_set()
                if more:
                    claimed_at = self.now_ms()
                    ledger.send_claim_due(claiming, claimed_at, self.batch, self.hold_ms)
                upcoming = self._decide(rows, now)
                self._account(batch, ledger.read_apply(applying))
                if time.monotonic() - beat > 1.0:  # a round trip queued behind the scripts
                    self._heartbeat()
                    beat = time.monotonic()
                batch = upcoming
                if not more:
                    self._commit(batch)
                    clean = True
                    return
        finally:
            for conn in (applying, claiming):
                if not clean:
                    conn.disconnect()  # type: ignore[no-untyped-call]  # a reply may be unread
                pool.release(conn)

    def stop(self) -> None:
        """Stop the loop; a blocking wait is woken at once (safe from a signal handler)."""
        self._stop.set()
        if self.app.settings.cluster:
            return  # _listen sees _stop within a second; nothing blocks on a wake list
        # A connection of its own: a signal may interrupt the pool's lock holder.
        with (
            contextlib.suppress(redis.RedisError),
            redis.Redis.from_url(self.app.redis_url, socket_timeout=1) as client,
        ):
            ledger = self.app.ledger
            cell = self.held[0] if ledger.cells is not None and self.held else None
            wake = ledger.keys.wake if cell is None else ledger.in_cell(cell).keys.wake
            client.lpush(wake, "stop")

    def _sleep(self) -> None:
        now = self.now_ms()
        ledger = self.app.ledger
        max_ms = int(self.max_sleep * 1000)
        if ledger.cells is None:
            wake_at = ledger.plan_sleep(now, max_ms)
        elif self.held:
            wake_at = ledger.plan_sleep_cells(self.held, now, max_ms)
        else:  # no cell for this one now (more schedulers than cells): look again later
            wake_at = now + max_ms
        seconds = sleep_seconds(wake_at, now, self.max_sleep)
        if seconds <= 0.001:
            return
        if self.app.settings.cluster:
            self._listen(seconds)
            return
        if seconds < SHORT_SLEEP_S:
            # A server checks blocked clients' timeouts only every 1/hz s (100 ms at
            # the default hz 10): a short BLPOP would oversleep. Sleep here instead.
            self._stop.wait(seconds)
            return
        # Woken early when a script adds an item due before the planned wake-up. An idle
        # server times blocked clients out only when its event loop wakes (every 1/hz s):
        # block until SHORT_SLEEP_S before the due time and take the rest locally.
        # Cells mode on one server: one BLPOP waits on the wake lists of every cell held.
        if ledger.cells is None:
            wakes = [ledger.keys.wake]
        else:
            wakes = [ledger.in_cell(c).keys.wake for c in self.held]
        if not wakes:
            self._stop.wait(seconds)
            return
        timeout = max(seconds - SHORT_SLEEP_S, 0.01)  # 0 would block for ever
        self._blocking_client().blpop(wakes, timeout=timeout)

    def _listen(self, seconds: float) -> None:
        """Cluster: sleep ``seconds``, or until a notice of a held cell (after at least
        CLUSTER_POLL_S); the subscription follows the cells held."""
        began = time.monotonic()
        channels = [ch for c in self.held for ch in self._cell_channels(c)]
        if self._notices is None or self._listening != channels:
            self._drop_notices()
            if not channels:
                self._stop.wait(seconds)
                return
            self._notices = ShardedSubscription(self.app.redis, channels)
            self._listening = channels
        end = began + seconds
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            msg = self._notices.get_message(timeout=min(left, 1.0))
            # A slot that left its node (unsubscribe) is subscribed again on the next
            # call; what it announced meanwhile is gone: look now.
            if msg is not None and msg.get("type") in ("message", "unsubscribe"):
                while self._notices.get_message(timeout=0.0) is not None:
                    pass  # one look answers every notice so far: none piles up
                self._stop.wait(max(0.0, began + CLUSTER_POLL_S - time.monotonic()))
                return

    def _cell_channels(self, cell: int) -> tuple[str, str]:
        keys = self.app.ledger.in_cell(cell).keys
        return keys.notify, keys.notify_steps

    def _drop_notices(self) -> None:
        notices, self._notices, self._listening = self._notices, None, []
        if notices is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                notices.close()

    def _blocking_client(self) -> redis.Redis:
        if self._blocking is None:
            self._blocking = redis.Redis.from_url(
                self.app.redis_url, socket_timeout=self.max_sleep + 10, socket_connect_timeout=5
            )
        return self._blocking

    def _heartbeat(self) -> None:
        self.app.redis.hset(self.app.ledger.keys.schedulers, self.id, self.now_ms())
        self._beat = time.monotonic()

    def _heartbeat_every_s(self, seconds: float) -> None:
        if time.monotonic() - self._beat > seconds:
            self._heartbeat()

    def _maintain(self) -> None:
        """Forget index entries of finished operations past retention (the records expire)."""
        now = time.monotonic()
        if now - self._last_maintenance < MAINTENANCE_EVERY_S:
            return
        self._last_maintenance = now
        keys = self.app.ledger.keys
        cutoff = self.now_ms() - self.app.settings.recovery.retention * 1000
        pipe = self.app.redis.pipeline(transaction=False)
        for tool in self.app.ledger.tools():
            for cell in self.app.ledger.every_cell():
                for state in TERMINAL:
                    pipe.zremrangebyscore(cell.keys.index(tool, state), "-inf", cutoff)
        stale = self.now_ms() - 3_600_000
        for sid, beat in self.app.redis.hgetall(keys.schedulers).items():
            if int(beat) < stale:
                pipe.hdel(keys.schedulers, sid)
        pipe.execute()

    def close(self) -> None:
        if self._depths is not None:
            self._depths.close()
        self._drop_notices()
        if self.held:  # the others take them over now, not when the leases run out
            with contextlib.suppress(redis.RedisError):
                self.app.ledger.release_cells(self.id, self.held)
            self.held = []
        self.app.redis.hdel(self.app.ledger.keys.schedulers, self.id)
        if self._blocking is not None:
            self._blocking.close()


def _int(value: Any) -> int:
    try:
        return int(float(value or 0))
    except (TypeError, ValueError):
        return 0


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
