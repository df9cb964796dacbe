"""Which part of the ledger a scheduler walks: one class per layout, picked once
(:func:`share_for`), so that the scheduler's loop never tests the mode.

==============  ===========================  ==============================  ===============
share           takes its due items          a backlog (a full batch due)    waits on
==============  ===========================  ==============================  ===============
OneTag          one claim (the whole ledger) the pipelined drain             the ledger's
LeasedCells     one claim per cell it holds  batch by batch, beat each 1 s   its held cells'
==============  ===========================  ==============================  ===============

Cells: schedulers share the cells, each holding a lease on its own (renewed every
round, at most every :data:`LEASE_EVERY_S`). A dead scheduler's cells are free once its
leases run out (:attr:`LeasedCells.ttl_ms`) and its beat is older than that.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import redis

from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.replies import number
from toolq.core.keys import Keys
from toolq.core.layout import Cells, Layout, SingleTag
from toolq.core.text import as_text
from toolq.services.scheduler.batch import Batch, Rounds

log = logging.getLogger("toolq.scheduler")

#: Cells: how often a scheduler renews its leases and takes its share, at most.
LEASE_EVERY_S = 1.0
#: Drain: a round trip queued behind the scripts, at least this often.
DRAIN_BEAT_S = 1.0


class Share(ABC):
    """The due items a scheduler takes, plans its sleep on and waits for."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @abstractmethod
    def take(self, now_ms: int, limit: int, hold_ms: int) -> tuple[list[dict[str, str]], bool]:
        """Claim due items (hidden from other claims for ``hold_ms``): the rows, and
        whether a full batch was due somewhere (more is due right now)."""

    @abstractmethod
    def plan(self, now_ms: int, max_ms: int) -> int:
        """When to look again (ms): the earliest due item, at most ``max_ms`` away."""

    @abstractmethod
    def cells(self) -> list[Keys]:
        """The keys whose wake lists, or notices, announce an item due sooner."""

    @abstractmethod
    def keep_up(self, rounds: Rounds, batch: Batch) -> None:
        """A full batch was due: apply ``batch`` and whatever is due behind it."""

    @property
    def held(self) -> list[int]:
        """The cells this scheduler holds the lease of (none without cells)."""
        return []

    def lease(self, force: bool = False) -> list[int]:
        """Renew this scheduler's share (cells: at most every LEASE_EVERY_S)."""
        return self.held

    def release(self) -> None:  # noqa: B027  (nothing held)
        """Stopping: give up what others should take over now."""


class OneTag(Share):
    """The single tag: the whole ledger is this scheduler's (several schedulers race on
    the same items; every transition is a compare-and-set)."""

    def take(self, now_ms: int, limit: int, hold_ms: int) -> tuple[list[dict[str, str]], bool]:
        rows = self.ledger.claim_due(now_ms, limit, hold_ms)
        return rows, len(rows) >= limit

    def plan(self, now_ms: int, max_ms: int) -> int:
        return self.ledger.plan_sleep(now_ms, max_ms)

    def cells(self) -> list[Keys]:
        return [self.ledger.keys]

    def keep_up(self, rounds: Rounds, batch: Batch) -> None:
        """Many items due at once: keep the server and this process busy together.

        Each round sends batch N's APPLY and the claim of batch N+2, then decides
        batch N+1 while the server runs them (two connections of its own, one
        thread). Batches never share an item: a claimed one is held, hidden from
        later claims, until its batch is applied or the hold runs out. Ends when
        a claim comes back short; any error leaves held items to reappear after
        the hold, and their transitions are compare-and-sets, so nothing doubles.
        (The raw connections reach one server: cells commit batch by batch.)
        """
        ledger = self.ledger
        ledger.load_scripts()
        pool = ledger.redis.connection_pool
        applying, claiming = pool.get_connection(), pool.get_connection()
        clean = False
        beat = time.monotonic()
        try:
            claimed_at = rounds.now_ms()
            ledger.send_claim_due(claiming, claimed_at, rounds.batch, rounds.hold_ms)
            while True:
                ledger.send_apply(applying, batch.transitions, batch.now)
                rows, now = ledger.read_claim_due(claiming), claimed_at
                more = len(rows) >= rounds.batch and not rounds.stopping()
                if more:
                    claimed_at = rounds.now_ms()
                    ledger.send_claim_due(claiming, claimed_at, rounds.batch, rounds.hold_ms)
                upcoming = rounds.decide(rows, now)
                rounds.account(batch, ledger.read_apply(applying))
                if time.monotonic() - beat > DRAIN_BEAT_S:
                    rounds.heartbeat()
                    beat = time.monotonic()
                batch = upcoming
                if not more:
                    rounds.commit(batch)
                    clean = True
                    return
        finally:
            for conn in (applying, claiming):
                if not clean:
                    conn.disconnect()  # type: ignore[no-untyped-call]  # a reply may be unread
                pool.release(conn)


class LeasedCells(Share):
    """Cells: the cells this scheduler holds the lease of, its fair share among the
    live schedulers (beats newer than a lease)."""

    def __init__(
        self,
        ledger: Ledger,
        holder: str,
        ttl_ms: int,
        clock_ms: Callable[[], int],
    ) -> None:
        super().__init__(ledger)
        self.holder = holder
        #: How long a cell's lease outlives its last renewal.
        self.ttl_ms = ttl_ms
        self._clock_ms = clock_ms
        self._held: list[int] = []
        self._leased = -math.inf

    @property
    def held(self) -> list[int]:
        return self._held

    def lease(self, force: bool = False) -> list[int]:
        """Renew, give up or take cells' leases to hold this scheduler's share among
        the live ones (beats newer than a lease); at most every LEASE_EVERY_S."""
        now = time.monotonic()
        if not force and now - self._leased < LEASE_EVERY_S:
            return self._held
        self._leased = now
        ledger = self.ledger
        oldest = self._clock_ms() - self.ttl_ms
        beats = ledger.redis.hgetall(ledger.keys.schedulers)
        live = {as_text(sid) for sid, beat in beats.items() if number(beat) >= oldest} | {
            self.holder
        }
        held = ledger.hold_cells(self.holder, self._held, self.ttl_ms, len(live))
        if held != self._held:
            log.info(
                "scheduler %s holds %d cells (%d live schedulers)",
                self.holder,
                len(held),
                len(live),
            )
        self._held = held
        return held

    def take(self, now_ms: int, limit: int, hold_ms: int) -> tuple[list[dict[str, str]], bool]:
        held = self.lease()
        rows: list[dict[str, str]] = []
        full = False
        if not held:
            return rows, full
        for taken in self.ledger.claim_due_cells(held, now_ms, limit, hold_ms):
            rows += taken
            full = full or len(taken) >= limit
        return rows, full

    def plan(self, now_ms: int, max_ms: int) -> int:
        if not self._held:  # no cell for this one now (more schedulers than cells)
            return now_ms + max_ms
        return self.ledger.plan_sleep_cells(self._held, now_ms, max_ms)

    def cells(self) -> list[Keys]:
        return [self.ledger.in_cell(c).keys for c in self._held]

    def keep_up(self, rounds: Rounds, batch: Batch) -> None:
        rounds.commit(batch)
        rounds.heartbeat_every_s(DRAIN_BEAT_S)

    def release(self) -> None:
        if self._held:  # the others take them over now, not when the leases run out
            with contextlib.suppress(redis.RedisError):
                self.ledger.release_cells(self.holder, self._held)
            self._held = []


def share_for(
    layout: Layout, ledger: Ledger, holder: str, ttl_ms: int, clock_ms: Callable[[], int]
) -> Share:
    """The share of a scheduler (``holder``) on a ledger with this layout."""
    build: dict[type[Layout], Callable[[], Share]] = {
        SingleTag: lambda: OneTag(ledger),
        Cells: lambda: LeasedCells(ledger, holder, ttl_ms, clock_ms),
    }
    return build[type(layout)]()
