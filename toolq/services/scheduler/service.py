"""The scheduler service: owns every delay, jitter and attempt count.

Not Celery beat and not countdown/ETA. Operations wait in a Redis sorted set
scored by the time the scheduler must next look at them. A loop takes due
items in batches (one script call), decides what each needs with the pure
:func:`~toolq.decisions.recovery.policy.decide`, and applies the transitions in one
more script call that also publishes their Celery messages, so a crash
between "decided" and "published" cannot lose or double a dispatch.

Several schedulers may run at once: a batch one of them took is hidden from
the others for ``hold`` seconds, and every transition is a compare-and-set on
the record's revision, so a race ends in one dispatch.

The deployment's mode is three objects picked once from the topology: which
cells the scheduler walks (:mod:`toolq.services.scheduler.share`), how it waits for a
wake-up (:mod:`toolq.topology.listen`) and how it reads the queues' backlog
(:mod:`toolq.services.scheduler.ages`); the loop asks them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import NoScriptError, TryAgainError

from toolq.adapters.outage import UNREACHABLE
from toolq.core import errors
from toolq.core.states import PENDING_RECOVERY, TERMINAL
from toolq.core.tools import Registry
from toolq.decisions.recovery import outcome
from toolq.decisions.recovery.actions import for_decision
from toolq.decisions.recovery.policy import Action, Snapshot, Timeouts, decide, sleep_seconds
from toolq.process import tracing
from toolq.process.logs import about
from toolq.process.waiting import Outage, Waiter
from toolq.services import parts
from toolq.services.scheduler.ages import ages_for
from toolq.services.scheduler.batch import Batch, TickStats
from toolq.services.scheduler.series import Sampler
from toolq.services.scheduler.share import share_for
from toolq.topology.listen import wake_listener

__all__ = ["LEDGER_DOWN", "Parts", "Scheduler", "TickStats"]


class Parts(parts.Parts, Protocol):
    """What the scheduler runs on (:class:`toolq.client.app.App` has all of it): a
    relay's parts, its tools and its recovery policy."""

    registry: Registry

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


#: Records passed over that a scheduler remembers having said (past it: said again).
PASSED_OVER_SAID = 10_000


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
        #: Records passed over (their transition failed), said once each: they stay
        #: due, and a traceback every round for each would bury the log.
        self._said_passed: set[str] = set()
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
        topology = app.topology
        #: The mode, picked once: the cells walked, the wake-ups, the queues' backlog.
        self.share = share_for(topology.layout, app.ledger, self.id, self.lease_ttl_ms, self.now_ms)
        self.listener = wake_listener(
            topology,
            self._stop,
            client=app.redis,
            redis_url=app.redis_url,
            max_sleep=self.max_sleep,
        )
        self.ages = ages_for(topology, app)
        self._beat = 0.0
        self._last_maintenance = 0.0
        # The chart's samples (toolq.services.scheduler.series), one per interval across schedulers.
        every = topology.layout.every_cell()
        self._series = Sampler(lambda: app.redis, app.ledger.keys, self.clock, cells=every)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def lease_ttl_ms(self) -> int:
        """How long a cell's lease outlives its last renewal: past the longest sleep
        between two renewals, so that a live scheduler never loses one."""
        return int((3 * self.max_sleep + 5) * 1000)

    @property
    def held(self) -> list[int]:
        """Cells: the cells this scheduler holds the lease of (and walks)."""
        return self.share.held

    def lease(self, force: bool = False) -> list[int]:
        """Cells: renew, give up or take cells' leases (:meth:`LeasedCells.lease`)."""
        return self.share.lease(force)

    @property
    def timeouts(self) -> Timeouts:
        p = self.app.policy
        return Timeouts(p.unclaimed_after_ms, p.approval_timeout_ms, p.input_timeout_ms)

    def stopping(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ one batch

    def tick(self) -> TickStats:
        """Take one batch of due items and act on it; returns what was done."""
        return self.commit(self._take())

    def _take(self) -> Batch:
        """Claim a batch of due items (hidden from other ticks for ``hold``) and decide.

        With cells a batch from every cell held (one pipeline), decided together; it
        counts as full (more is due now) when any cell's was."""
        now = self.now_ms()
        rows, full = self.share.take(now, self.batch, self.hold_ms)
        batch = self.decide(rows, now)
        batch.full = full
        return batch

    def decide(self, rows: list[dict[str, str]], now: int) -> Batch:
        """What each claimed item needs: the batch's transitions, not yet applied."""
        app = self.app
        batch = Batch(now, TickStats(taken=len(rows)))
        if not rows:
            return batch
        stats = batch.stats
        policy = app.policy
        timeouts = self.timeouts
        queues = self.ages(rows)
        transitions, lags, left = batch.transitions, batch.lags, batch.left
        traced = batch.traced if tracing.enabled() else None
        for row in rows:
            snap = Snapshot.from_row(row)
            d = decide(snap, now, timeouts, queues)
            stats.actions[d.action] = stats.actions.get(d.action, 0) + 1
            tool = app.registry.get(snap.tool) if snap.tool in app.registry else None
            # the tool's own builders: its messages name it where Flower shows them
            messages = app.outbound_for(snap.tool)
            try:
                t = for_decision(d, snap, tool, row.get("call_id", ""), now, policy, messages)
            except Exception:  # one record it cannot decide must not hold back the batch
                self._passed_over(snap.ref, d.action)
                continue
            if t is None:
                if d.action is Action.DROP:
                    app.redis.zrem(app.ledger.keys_of(snap.ref).due, snap.ref)
                continue
            transitions.append(t)
            if traced is not None:
                created = int(float(row.get("created") or now))
                traced.append((snap.tool, row.get("trace", ""), now - created))
            leaves = not t.quiet and t.to != snap.state and snap.state in PENDING_RECOVERY
            left.append((snap.tool, str(snap.state), now - snap.entered_ms) if leaves else None)
            if d.action in (Action.DISPATCH, Action.RELEASE, Action.REPUBLISH, Action.VERIFY):
                lags.append(now - int(float(row.get("due_score") or now)))
            else:
                lags.append(-1)
        return batch

    def _passed_over(self, ref: str, action: object) -> None:
        if ref in self._said_passed:
            log.debug("scheduler: %s (%s) passed over again", ref, action)
            return
        if len(self._said_passed) >= PASSED_OVER_SAID:
            self._said_passed.clear()
        self._said_passed.add(ref)
        log.exception("scheduler: %s (%s) passed over: its transition failed", ref, action)

    def commit(self, batch: Batch) -> TickStats:
        """Apply a batch's transitions (one script call) and count what took."""
        return self.account(batch, self.app.ledger.apply(batch.transitions, batch.now))

    def account(self, batch: Batch, results: list[str]) -> TickStats:
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
                with about(t.ref):
                    log.debug("%s: %s refused (now %s)", t.ref, t.to, res)
        if batch.traced:
            _trace(batch, results)
        if self.on_tick is not None and stats.taken:
            self.on_tick(stats)
        return stats

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Run until :meth:`stop`. Never ends on its own: the server away (for any
        time), or a round failing unexpectedly, is waited out with a capped backoff
        (:mod:`toolq.process.waiting`), one log line when the wait starts and one when it ends."""
        log.info("scheduler %s started on %s", self.id, self.app.settings.safe_url)
        while not self._stop.is_set():
            try:
                self._round()
                self.ledger_wait.answered()
                self.fault_wait.answered()
            except LEDGER_DOWN as exc:
                self.listener.drop()  # subscribed again on the next sleep
                self.ledger_wait.failed(exc)
            except errors.RequestRefused:
                # On a ledger moved into cells, a scheduler without TOOLQ_CELLS would
                # find nothing due, ever: a misconfiguration is said, not waited out.
                raise
            except Exception as exc:
                self.listener.drop()
                self.fault_wait.failed(exc, traceback=True)
        log.info("scheduler %s stopped", self.id)

    def _round(self) -> None:
        """One batch taken and applied, or a backlog kept up with; then beat and sleep."""
        if not self.app.ledger.cells_checked:
            self.app.ledger.record_cells()
        batch = self._take()
        if batch.full:  # more is due right now
            self.share.keep_up(self, batch)
            return
        self.commit(batch)
        self.heartbeat()
        self._series.maybe()
        self._maintain()
        self._sleep()

    def stop(self) -> None:
        """Stop the loop; a blocking wait is woken at once (safe from a signal handler)."""
        self._stop.set()
        self.listener.interrupt(self.share.cells())

    def _sleep(self) -> None:
        now = self.now_ms()
        wake_at = self.share.plan(now, int(self.max_sleep * 1000))
        seconds = sleep_seconds(wake_at, now, self.max_sleep)
        if seconds <= 0.001:
            return
        # Woken early when a script adds an item due before the planned wake-up.
        self.listener.wait(seconds, self.share.cells())

    def heartbeat(self) -> None:
        self.app.redis.hset(self.app.ledger.keys.schedulers, self.id, self.now_ms())
        self._beat = time.monotonic()

    def heartbeat_every_s(self, seconds: float) -> None:
        if time.monotonic() - self._beat > seconds:
            self.heartbeat()

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
        self.ages.close()
        self.listener.drop()
        self.share.release()  # the others take its cells over now
        self.app.redis.hdel(self.app.ledger.keys.schedulers, self.id)
        self.listener.close()


def _trace(batch: Batch, results: list[str]) -> None:
    """A ``dispatch`` span per move the batch made (tracing on): each in its operation's
    trace, or linked to it when the operation is old (:data:`tracing.LINK_AFTER_MS`)."""
    for t, res, (tool, stored, age_ms) in zip(
        batch.transitions, results, batch.traced, strict=True
    ):
        with about(t.ref), tracing.dispatched(tool, t.ref, stored, age_ms, t.by) as span:
            span.recorded(t, res, batch.now)
