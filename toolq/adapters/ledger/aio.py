"""The ledger on ``redis.asyncio``: what ``tq.aio`` reads and writes.

The same scripts, KEYS and ARGV as the sync :class:`~toolq.adapters.ledger.store.Ledger`
(built by the one :class:`~toolq.adapters.ledger.wire.ScriptArgs`), and the same reading
of their replies; only the sending awaits. Clients write (submit, operator
actions) and read; the asyncio pool's workers claim, renew and record here too
(:mod:`toolq.services.tasks.run_aio`). The scheduler's calls stay with the sync ledger.

A redis.asyncio client belongs to the event loop it connects on, so one
AsyncLedger serves one loop. On a Cluster
(:class:`toolq.adapters.ledger.cluster.AsyncLedgerCluster`)
every call by ref goes to its cell's node as the sync ledger's does: each
command and script call names keys of one cell, so the client routes it.

``batch``: on one server, the claims and records the loop's callers ask while one
round trip is out go together in the next, at most so many (the asyncio pool's
ledger: :mod:`toolq.adapters.ledger.aio_batch`); 0 (a client's): each its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from toolq.adapters.ledger.ack import UNACKED_KEYS
from toolq.adapters.ledger.aio_batch import PipelinedScripts
from toolq.adapters.ledger.cluster import InFlight
from toolq.adapters.ledger.durable import AsyncDurability, AsyncNodes, AsyncOneServer
from toolq.adapters.ledger.replies import (
    Claim,
    SubmitResult,
    claim_result,
    fields_of,
    history_of,
    history_start,
    record_of,
    strs,
    submit_result,
)
from toolq.adapters.ledger.routes import Routes
from toolq.adapters.ledger.runner import AsyncScripts
from toolq.adapters.ledger.stored_format import aformat_checked
from toolq.adapters.ledger.wire import Push
from toolq.core.layout import Layout
from toolq.core.record import HistoryEntry, OperationRecord
from toolq.decisions.recovery.transition import Transition

__all__ = ["AsyncLedger", "AsyncScripts"]


class AsyncLedger(Routes):
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = "toolq",
        durability: str = "none",
        *,
        outbox: bool = False,
        cells: int | None = None,
        in_flight: InFlight | None = None,
        layout: Layout | None = None,
        push: Push | None = None,
        nodes: AsyncNodes | None = None,
        batch: int = 0,
    ) -> None:
        self.redis = client
        #: Turns of at most so many commands out at once (None: no bound): a Cluster
        #: client's node raises when it has no free connection instead of waiting for
        #: one. The client takes turns of the same (AsyncLedgerCluster.in_flight).
        self._in_flight = in_flight
        #: A submit is on disk before it is acknowledged, as the sync ledger's is
        #: (``ToolqSettings.durability``, :mod:`toolq.adapters.ledger.durability`).
        self.durable = AsyncDurability(client, durability, nodes=nodes)
        #: Where every call by ref goes (as the sync Ledger's).
        self.route_by(prefix, None, layout, push, outbox=outbox, cells=cells)
        self.scripts = AsyncScripts(client, replace=self.durable.nodes.replace_library)
        #: Claims and records in batches (one server only: a Cluster's calls are routed
        #: one by one, :mod:`toolq.adapters.ledger.route`).
        self.batches: PipelinedScripts | None = None
        if batch and isinstance(self.durable.nodes, AsyncOneServer):
            self.batches = PipelinedScripts(self.scripts, self.durable, batch)

    async def stop_batches(self) -> None:
        """Stop the batches' tasks (the loop is closing): callers still waiting are cancelled."""
        if self.batches is not None:
            await self.batches.aclose()

    async def record_cells(self) -> None:
        """:meth:`toolq.adapters.ledger.store.Ledger.record_cells` (errors.RequestRefused)."""
        pipe = self.redis.pipeline(transaction=False)
        self.ask_cells(pipe)
        async with self._command():
            answers = await pipe.execute()
        recorded = self.cells_refused(answers)
        async with self._command():
            await aformat_checked(self.redis, self.keys.prefix, recorded)

    @contextlib.asynccontextmanager
    async def _command(self) -> AsyncIterator[None]:
        """Around every command: its caller's cancellation is never lost in it, and
        it waits for its turn while ``in_flight`` commands are out."""
        if self._in_flight is None:
            yield
        else:
            async with self._in_flight.turn():
                yield
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Python 3.11's asyncio.wait_for, which redis-py sends every command
            # through, returns the inner result when its caller is cancelled just
            # as the send completes: the cancellation is swallowed (fixed in 3.12),
            # and a cancelled wait would go on waiting. Raise it again.
            raise asyncio.CancelledError

    async def submit(self, **operation: Any) -> SubmitResult:
        """Create an operation (the fields of :class:`toolq.calls.NewOperation`)."""
        keys, args = self.calls_of(operation["ref"]).submit(**operation)
        async with self._command():
            return submit_result(await self.durable.call(self.scripts, "submit", keys, args))

    async def claim(
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
        """:meth:`toolq.adapters.ledger.store.Ledger.claim`, awaited."""
        calls = self.calls_of(ref)
        keys, args = calls.claim(ref, attempt, holder, now_ms, lease_ms, kind, vcheck, ack, limits)
        durable = kind == "run"  # a claim a power loss undid would run the tool again
        async with self._command():
            return claim_result(await self._script("claim", keys, args, durable=durable))

    async def _script(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], *, durable: bool = False
    ) -> Any:
        """One script call: in the loop's batches when it has them, else alone; a
        ``durable`` one confirmed on disk or by replicas (``self.durable``)."""
        if self.batches is not None:
            return await self.batches(name, keys, args, durable=durable)
        if durable:
            return await self.durable.call(self.scripts, name, keys, args)
        return await self.scripts(name, keys, args)

    async def renew(
        self, now_ms: int, lease_ms: int, held: Sequence[tuple[str, int, str, str]]
    ) -> list[str]:
        """:meth:`toolq.adapters.ledger.store.Ledger.renew`, awaited: one call per cell."""
        lost: list[str] = []
        for cell, where in self.layout.group([h[0] for h in held]).items():
            keys, args = self.calls_at(cell).renew(now_ms, lease_ms, [held[i] for i in where])
            async with self._command():
                lost += strs(await self.scripts("renew", keys, args))
        return lost

    async def apply(
        self, transitions: Sequence[Transition], now_ms: int, ack: str | None = None
    ) -> list[str]:
        """Apply transitions atomically, one script call per cell; ``"ok"`` or the state
        that refused. ``ack``: as :meth:`toolq.adapters.ledger.store.Ledger.apply`'s."""
        results = [""] * len(transitions)
        for cell, where in self.layout.group([t.ref for t in transitions]).items():
            keys, args = self.calls_at(cell).apply([transitions[i] for i in where], now_ms, ack)
            ack = None  # acknowledged once
            async with self._command():
                answers = strs(await self._script("apply", keys, args))
            for i, res in zip(where, answers, strict=True):
                results[i] = res
        return results

    async def apply_one(self, transition: Transition, now_ms: int, ack: str | None = None) -> str:
        return (await self.apply([transition], now_ms, ack))[0]

    async def ack(self, delivery: str) -> None:
        """:meth:`toolq.adapters.ledger.store.Ledger.ack`, awaited."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(UNACKED_KEYS[0], delivery)
        pipe.zrem(UNACKED_KEYS[1], delivery)
        async with self._command():
            await pipe.execute()

    async def get(self, ref: str, *, with_history: bool = True) -> OperationRecord | None:
        async with self._command():
            raw = await self.redis.hgetall(self.calls_of(ref).keys.op(ref))
        return record_of(raw, with_history)

    async def fields(self, ref: str, *names: str) -> dict[str, str]:
        async with self._command():
            values = await self.redis.hmget(self.calls_of(ref).keys.op(ref), list(names))
        return fields_of(names, values)

    async def history(self, ref: str, after: int = 0) -> list[HistoryEntry]:
        """The history entries after the first ``after``; OperationNotFound for no operation."""
        start = history_start(after)
        async with self._command():
            raw = await self.redis.hgetall(self.calls_of(ref).keys.op(ref))
        return history_of(ref, raw, start)

    async def state_of(self, ref: str) -> tuple[dict[str, str], int]:
        """The record's state, rev and envelope, and how many history entries it has."""
        names = ("state", "rev", "envelope", "hn")
        async with self._command():
            values = await self.redis.hmget(self.calls_of(ref).keys.op(ref), list(names))
        fields = fields_of(names, values)
        return fields, int(fields.pop("hn", None) or 0)

    async def ping(self) -> None:
        async with self._command():
            await self.redis.ping()
