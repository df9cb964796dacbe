"""The scheduler's ledger calls: claiming due work, planning its sleep, and, in
cells mode, the calls on every cell it holds (pipelined) and the cells' leases.

A mixin of :class:`toolq.adapters.ledger.store.Ledger`: what changes with the scheduler's
loop (its drain keeps calls in flight on connections of its own) changes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.connection import Connection

from toolq.adapters.ledger.replies import due_rows, sleep_ms, strs
from toolq.adapters.ledger.runner import Scripts, lost_scripts
from toolq.adapters.ledger.wire import Call, ScriptArgs
from toolq.core.cells import lease_plan
from toolq.core.keys import Keys
from toolq.decisions.recovery.transition import Transition

if TYPE_CHECKING:
    from toolq.core.layout import Layout


class SchedulerCalls:
    """What the scheduler asks of the ledger (see the module's docstring)."""

    redis: redis.Redis
    scripts: Scripts
    calls: ScriptArgs
    layout: Layout

    def calls_at(self, keys: Keys) -> ScriptArgs:
        raise NotImplementedError

    def claim_due(self, now_ms: int, limit: int, hold_ms: int) -> list[dict[str, str]]:
        keys, args = self.calls.claim_due(now_ms, limit, hold_ms)
        return due_rows(self.scripts("claim_due", keys, args))

    def plan_sleep(self, now_ms: int, max_ms: int) -> int:
        """Record when the scheduler will wake (the earliest due item, at most max_ms away)."""
        keys, args = self.calls.plan_sleep(now_ms, max_ms)
        return sleep_ms(self.scripts("plan_sleep", keys, args))

    # Cells mode: the scheduler's two calls on every cell, pipelined (a ClusterPipeline
    # sends each node its cells' calls together).

    def claim_due_cells(
        self, cells: Sequence[int], now_ms: int, limit: int, hold_ms: int
    ) -> list[list[dict[str, str]]]:
        """:meth:`claim_due` in each of ``cells``, in that order."""
        calls = [self._cell(c).claim_due(now_ms, limit, hold_ms) for c in cells]
        return [due_rows(raw) for raw in self._on_cells("claim_due", calls)]

    def plan_sleep_cells(self, cells: Sequence[int], now_ms: int, max_ms: int) -> int:
        """:meth:`plan_sleep` in each of ``cells``: the earliest wake-up over them."""
        calls = [self._cell(c).plan_sleep(now_ms, max_ms) for c in cells]
        return min(sleep_ms(raw) for raw in self._on_cells("plan_sleep", calls))

    def hold_cells(
        self, holder: str, held: Sequence[int], ttl_ms: int, schedulers: int
    ) -> list[int]:
        """Cells mode: the cells scheduler ``holder`` holds now, its fair share of them
        (:func:`toolq.core.cells.lease_plan` among ``schedulers`` live ones). Renews the
        leases of ``held`` it keeps (for ``ttl_ms``), gives up the rest, and takes free
        or expired ones while below its share. At most three round trips."""
        cells = self._cells()
        release, _ = lease_plan(list(held), len(cells), schedulers)
        gone = set(release)
        keep = [c for c in held if c not in gone]
        calls = [self._cell(c).cell_lease(holder, ttl_ms, "hold") for c in keep]
        calls += [self._cell(c).cell_lease(holder, ttl_ms, "release") for c in release]
        answers = self._on_cells("cell_lease", calls) if calls else []
        now_held = [c for c, held_now in zip(keep, answers, strict=False) if int(held_now)]
        _, want = lease_plan(now_held, len(cells), schedulers)
        if want > 0:
            pipe = self.redis.pipeline(transaction=False)
            mine = set(now_held)
            others = [c for c in cells if c not in mine]
            for c in others:
                pipe.get(self._cell(c).keys.cell_lease)
            free = [c for c, who in zip(others, pipe.execute(), strict=True) if who is None][:want]
            if free:
                taking = [self._cell(c).cell_lease(holder, ttl_ms, "hold") for c in free]
                answers = self._on_cells("cell_lease", taking)
                now_held += [c for c, took in zip(free, answers, strict=True) if int(took)]
        return sorted(now_held)

    def release_cells(self, holder: str, held: Sequence[int]) -> None:
        """Give up the leases of ``held`` (a scheduler stopping: others take over at once)."""
        if held:
            calls = [self._cell(c).cell_lease(holder, 0, "release") for c in held]
            self._on_cells("cell_lease", calls)

    def _cell(self, cell: int) -> ScriptArgs:
        return self.calls_at(Keys(self.calls.keys.prefix, cell))

    def _cells(self) -> range:
        cells = self.layout.cells
        if cells is None:
            raise ValueError("not in cells mode")
        return range(cells)

    def _on_cells(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Script ``name`` once per (keys, args), in one pipeline; loaded again and the
        whole pipeline sent again when the server lost the scripts (what a first
        CLAIM_DUE held then comes back after its hold: later, never lost)."""
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=False)
            for keys, args in calls:
                pipe.execute_command(*self.scripts.command(name, keys, args))  # type: ignore[no-untyped-call]
            try:
                return list(pipe.execute())
            except redis.ResponseError as exc:
                if attempt == 2 or not lost_scripts(exc):
                    raise
                self.scripts.load()
        raise AssertionError("unreachable")

    # The same two calls split into send and read, for a caller that keeps them in
    # flight on connections of its own (the scheduler's drain). The scripts must be
    # loaded (load_scripts); a server that lost them answers NOSCRIPT (NoScriptError).

    def load_scripts(self) -> None:
        self.scripts.load()

    def send_apply(self, conn: Connection, transitions: Sequence[Transition], now_ms: int) -> None:
        keys, args = self.calls.apply(transitions, now_ms)
        conn.send_command(*self.scripts.command("apply", keys, args))  # type: ignore[no-untyped-call]

    def read_apply(self, conn: Connection) -> list[str]:
        return strs(_read_script_reply(conn))

    def send_claim_due(self, conn: Connection, now_ms: int, limit: int, hold_ms: int) -> None:
        keys, args = self.calls.claim_due(now_ms, limit, hold_ms)
        conn.send_command(*self.scripts.command("claim_due", keys, args))  # type: ignore[no-untyped-call]

    def read_claim_due(self, conn: Connection) -> list[dict[str, str]]:
        return due_rows(_read_script_reply(conn))


def _read_script_reply(conn: Connection) -> Any:
    """A raw script call's reply; a lost library reads as NOSCRIPT, as a lost script does."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        if lost_scripts(exc) and not isinstance(exc, redis.exceptions.NoScriptError):
            raise redis.exceptions.NoScriptError(str(exc)) from exc
        raise
