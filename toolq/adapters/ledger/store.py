"""The ledger in Redis: operation records, history, indexes, and transitions.

Every write is one Lua script call (:mod:`toolq.adapters.ledger.scripts`); which
transition to ask for is decided by pure code (:mod:`toolq.core.states`,
:mod:`toolq.decisions.recovery.outcome`, :mod:`toolq.decisions.recovery.policy`). The transition
table is checked twice from one source: when a :class:`Transition` is built,
and by the scripts, into which it is rendered. Every key a script touches is
passed to it in KEYS, named by :class:`toolq.core.keys.Keys` and built by
:mod:`toolq.adapters.ledger.wire`; the replies are read by :mod:`toolq.adapters.ledger.replies`.

The deployment's modes are strategies the caller passes (the topology picks
them, :func:`toolq.topology.ledger.ledger_for`): the :class:`toolq.core.layout.Layout`
(where a ref's keys are), the :class:`toolq.adapters.ledger.wire.Push` (inline or outbox)
and the :class:`toolq.adapters.ledger.durable.Nodes` (one server or a Cluster).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import redis

from toolq.adapters.ledger import ack as acks
from toolq.adapters.ledger.ack import UNACKED_KEYS
from toolq.adapters.ledger.durable import Durability, Nodes
from toolq.adapters.ledger.replies import (
    Claim,
    SubmitResult,
    claim_result,
    entries_of,
    fields_of,
    history_of,
    history_start,
    record_of,
    strs,
    submit_result,
)
from toolq.adapters.ledger.routes import Pinned, Routes, strategies
from toolq.adapters.ledger.runner import Scripts
from toolq.adapters.ledger.schedule import SchedulerCalls
from toolq.adapters.ledger.stored_format import format_checked
from toolq.adapters.ledger.wire import Push
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.keys import Keys
from toolq.core.layout import Layout
from toolq.core.record import HistoryEntry, OperationRecord, load_envelope
from toolq.decisions.recovery.transition import Transition

#: Names other modules import from here (the readers and runner moved out).
__all__ = [
    "UNACKED_KEYS",
    "Claim",
    "Ledger",
    "Pinned",
    "Scripts",
    "SubmitResult",
    "entries_of",
    "strategies",
]


class Ledger(Routes, SchedulerCalls):
    """Operation records in Redis. One instance per process; thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "toolq",
        durability: str = "none",
        *,
        outbox: bool = False,
        cell: int | None = None,
        cells: int | None = None,
        layout: Layout | None = None,
        push: Push | None = None,
        nodes: Nodes | None = None,
    ) -> None:
        self.redis = client
        #: Submits and claims of runs are on disk before they are answered
        #: (``ToolqSettings.durability``, :mod:`toolq.adapters.ledger.durability`).
        self.durable = Durability(client, durability, nodes=nodes)
        #: Where every call by ref goes; the per-cell keys (due, wake, stats, tools,
        #: indexes, outbox) are each cell's (:meth:`in_cell`).
        self.route_by(prefix, cell, layout, push, outbox=outbox, cells=cells)
        self.scripts = Scripts(client, replace=self.durable.nodes.replace_library)
        #: :meth:`record_cells` ran: the number of cells (or none) is the ledger's.
        self.cells_checked = False

    def in_cell(self, cell: int) -> Ledger:
        """This ledger's calls on the keys of ``cell`` (:mod:`toolq.core.cells`): the same
        client, durability and loaded scripts, so a process needs one Ledger per
        cell it touches and loads the library once. Calls by ref still go to the
        ref's cell; a ledger without cells is pinned to ``cell``."""
        other = copy.copy(self)
        other.calls = self.calls_at(Keys(self.keys.prefix, cell))
        other.keys = other.calls.keys
        if self.layout.cells is None:
            other.layout = Pinned(other.keys)
        return other

    def every_cell(self) -> list[Ledger]:
        """:meth:`in_cell` of every cell in cells mode; else this ledger alone."""
        if self.layout.cells is None:
            return [self]
        return [self.in_cell(cell) for cell in range(self.layout.cells)]

    def record_cells(self) -> None:
        """Cells mode: record the number of cells in the deployment's meta at first use,
        and refuse (errors.RequestRefused) a ledger recorded with another number. On the
        single tag: refuse a ledger that was moved into cells (``toolq cells migrate``).
        And the ledger's format: errors.LedgerFormat for an earlier or a newer one
        (:mod:`toolq.adapters.ledger.stored_format`); an empty ledger is stamped with today's."""
        pipe = self.redis.pipeline(transaction=False)
        self.ask_cells(pipe)
        format_checked(self.redis, self.keys.prefix, self.cells_refused(pipe.execute()))
        self.cells_checked = True

    # ------------------------------------------------------------------ writes

    def submit(self, **operation: Any) -> SubmitResult:
        """Create an operation (the fields of :class:`toolq.calls.NewOperation`).
        The first one checks the number of cells (:meth:`record_cells`) if nothing
        did yet: an operation written on the wrong layout is one no process reads."""
        if not self.cells_checked:
            self.record_cells()
        keys, args = self.calls_of(operation["ref"]).submit(**operation)
        return submit_result(self.durable.call(self.scripts, "submit", keys, args))

    def claim(
        self,
        ref: str,
        attempt: int,
        holder: str,
        now_ms: int,
        lease_ms: int,
        kind: str = "run",
        vcheck: int = 0,
        ack: str | None = None,
        limits: str = "",
    ) -> Claim:
        """Claim an attempt or a check; with ``ack`` (a Celery delivery tag), an answer
        other than claimed acknowledges the delivery in the same step. ``limits``: the
        worker's dependency limits (:func:`toolq.core.deps.limits_table`); a run whose
        key holds it back answers ``limited`` (its reason as ``state``)."""
        calls = self.calls_of(ref)
        keys, args = calls.claim(ref, attempt, holder, now_ms, lease_ms, kind, vcheck, ack, limits)
        if kind == "run":  # a claim a power loss undid would run the tool again
            return claim_result(self.durable.call(self.scripts, "claim", keys, args))
        return claim_result(self.scripts("claim", keys, args))

    def renew(
        self, now_ms: int, lease_ms: int, held: Sequence[tuple[str, int, str, str]]
    ) -> list[str]:
        """Extend leases given as (ref, attempt, kind, holder); returns the refs no longer
        held. One call per cell."""
        lost: list[str] = []
        for keys, where in self.layout.group([h[0] for h in held]).items():
            call = self.calls_at(keys).renew(now_ms, lease_ms, [held[i] for i in where])
            lost += strs(self.scripts("renew", *call))
        return lost

    def apply(
        self, transitions: Sequence[Transition], now_ms: int, ack: str | None = None
    ) -> list[str]:
        """Apply transitions atomically, one script call per cell; ``"ok"`` or the state
        that refused, in order.

        ``ack``: the Celery delivery tag this call ends, acknowledged in the same step
        (kombu's Redis transport on the ledger's server; see :mod:`toolq.adapters.ledger.ack`).
        """
        results = [""] * len(transitions)
        for keys, where in self.layout.group([t.ref for t in transitions]).items():
            call = self.calls_at(keys).apply([transitions[i] for i in where], now_ms, ack)
            ack = None  # acknowledged once
            for i, res in zip(where, strs(self.scripts("apply", *call)), strict=True):
                results[i] = res
        return results

    def apply_one(self, transition: Transition, now_ms: int, ack: str | None = None) -> str:
        return self.apply([transition], now_ms, ack)[0]

    def ack(self, delivery: str) -> None:
        """Acknowledge a Celery delivery that ends without a ledger call (what kombu's
        Redis transport sends on ack; see ``ack`` in :meth:`claim` and :meth:`apply`)."""
        acks.ack(self.redis, delivery)

    # ------------------------------------------------------------------ reads

    def get(self, ref: str, *, with_history: bool = True) -> OperationRecord | None:
        return record_of(self.redis.hgetall(self.keys_of(ref).op(ref)), with_history)

    def fields(self, ref: str, *names: str) -> dict[str, str]:
        return fields_of(names, self.redis.hmget(self.keys_of(ref).op(ref), list(names)))

    def history(self, ref: str, after: int = 0) -> list[HistoryEntry]:
        """The history entries after the first ``after``; OperationNotFound for no operation."""
        start = history_start(after)
        return history_of(ref, self.redis.hgetall(self.keys_of(ref).op(ref)), start)

    def envelope(self, ref: str) -> ToolSuccess | ToolError | None:
        raw = self.redis.hget(self.keys_of(ref).op(ref), "envelope")
        return None if raw is None else load_envelope(raw)

    def stats(self) -> dict[str, int]:
        """The counters (:attr:`Keys.stats`); in cells mode summed over every cell."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self._every_keys():
            pipe.hgetall(keys.stats)
        total: dict[str, int] = {}
        for raw in pipe.execute():
            for k, v in strs_map(raw).items():
                total[k] = total.get(k, 0) + int(v)
        return total

    def tools(self) -> list[str]:
        """Every tool the ledger has seen; in cells mode the union of every cell's."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self._every_keys():
            pipe.smembers(keys.tools)
        return sorted({t for raw in pipe.execute() for t in strs(raw)})

    def _every_keys(self) -> list[Keys]:
        """The keys a view walks: every cell's, or this ledger's own without cells."""
        return [ledger.keys for ledger in self.every_cell()]


def strs_map(raw: dict[Any, Any]) -> dict[str, str]:
    return dict(zip(strs(raw.keys()), strs(raw.values()), strict=True))
