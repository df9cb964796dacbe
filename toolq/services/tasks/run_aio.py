"""The task bodies on an event loop: claim, call, record, awaited (the asyncio pool).

The same steps as :class:`toolq.services.tasks.run.Runtime` (``run_attempt``,
``run_check``, ``_held``, ``_give_back``), in the same order, with the same pure
decisions (:mod:`toolq.decisions.recovery.outcome`), sent on the asyncio ledger
(:class:`toolq.adapters.ledger.aio.AsyncLedger`): thousands of calls in flight on
one loop need no thread each. An ``async def`` tool or verifier is awaited on the
loop; a ``def`` one runs on the pool's bounded threads (``blocking``).

Leases: one :class:`AsyncLeaseKeeper` per loop renews every lease the loop holds in
batches (one script call per cell and :data:`RENEW_BATCH` leases), as the sync
keeper's thread does.

A call cancelled on the loop (a worker's cold shutdown) records nothing: as a worker
that died mid-call, its lease runs out and the lease sweep settles it.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis

from toolq.adapters.broker.messages import REFUSED, Delivery, Outcome
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.adapters.ledger.replies import Claim, Claimed
from toolq.core.errors import NotDurable, safe_words
from toolq.core.states import State
from toolq.core.tools import CallContext, Tool
from toolq.decisions.recovery import outcome
from toolq.decisions.recovery.transition import Transition
from toolq.process import tracing
from toolq.services.tasks.leases import RenewalWord, holder_is_dead, process_holder, until_next
from toolq.services.tasks.run import (
    AWAY,
    LedgerAway,
    RecordAway,
    Runtime,
    _log_failure,
    _traced,
    holder_gone,
)

log = logging.getLogger("toolq.worker")

T = TypeVar("T")

#: Leases renewed in one script call (a loop holding more sends several, one after
#: the other: the server is not held for long by one).
RENEW_BATCH = 500

#: Runs a sync callable on the pool's threads and awaits its result.
Blocking = Callable[[Callable[[], T]], Awaitable[T]]


class AsyncLeaseKeeper:
    """:class:`toolq.services.tasks.leases.LeaseKeeper` for one event loop: a task on
    the loop renews every held lease each ``renew_every`` seconds, in batches."""

    def __init__(
        self, ledger: AsyncLedger, lease_ms: int, clock: Callable[[], float], renew_every: float
    ) -> None:
        self.ledger = ledger
        self.lease_ms = lease_ms
        self.clock = clock
        self.renew_every = renew_every
        self.holder = process_holder()
        self._seq = itertools.count(1)
        self._held: dict[tuple[str, int, str, str], int] = {}
        self._task: asyncio.Task[None] | None = None
        self._word = RenewalWord()

    def new_holder(self) -> str:
        """A lease-holder id for one delivery (this process's id and a number)."""
        if self._task is None or self._task.done():
            # A context of its own, not the first call's: the keeper's lines are about
            # no one operation (no operation_ref, no span of that call's).
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="toolq-aio-leases", context=contextvars.Context()
            )
        return f"{self.holder}:{next(self._seq)}"

    @property
    def held(self) -> int:
        return len(self._held)

    @contextmanager
    def hold(self, ref: str, attempt: int, kind: str, holder: str) -> Iterator[None]:
        key = (ref, attempt, kind, holder)
        self._held[key] = self._held.get(key, 0) + 1
        try:
            yield
        finally:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        while True:
            await asyncio.sleep(until_next(sent, self.renew_every, loop.time()))
            sent = loop.time()
            held = list(self._held)
            if not held:
                # RenewalWord.idle, awaited: while failing, the server's answer to a ping
                # is the "back", else an outage ended with nothing held said none.
                if self._word.failing:
                    try:
                        with self._word.asking():
                            await self.ledger.ping()
                    except Exception:  # never end the keeper
                        log.exception("lease keeper's ping failed; retrying")
                continue
            for start in range(0, len(held), RENEW_BATCH):
                batch = held[start : start + RENEW_BATCH]
                try:
                    lost = await self.ledger.renew(int(self.clock() * 1000), self.lease_ms, batch)
                except redis.RedisError as exc:
                    self._word.failed(exc)
                    break
                except Exception:  # never end the renewals of every call in flight
                    log.exception("lease renewal failed; retrying")
                    break
                self._word.renewed()
                still = {key[0] for key in self._held}  # not those recorded meanwhile
                for ref in lost:
                    if ref in still:
                        log.warning(
                            "lease lost for %s: the operation moved on without this worker", ref
                        )


class AioRuntime:
    """:class:`~toolq.services.tasks.run.Runtime`'s bodies on one event loop.

    ``sync``: the worker's Runtime, for its pure pieces (the registry, the policy, the
    message builders, the call context); ``ledger``: the loop's asyncio ledger;
    ``blocking``: how a ``def`` tool or verifier runs (the pool's threads); ``renew``:
    the ledger the leases are renewed on (its own connections; default ``ledger``).
    """

    def __init__(
        self,
        sync: Runtime,
        ledger: AsyncLedger,
        blocking: Blocking[Any],
        *,
        renew: AsyncLedger | None = None,
    ) -> None:
        self.sync = sync
        self.ledger = ledger
        self.blocking = blocking
        self.registry = sync.registry
        self.policy = sync.policy
        self.lease_ms = sync.lease_ms
        self.leases = AsyncLeaseKeeper(
            renew or ledger, sync.lease_ms, sync.clock, sync.leases.renew_every
        )

    def now_ms(self) -> int:
        return self.sync.now_ms()

    async def aclose(self) -> None:
        await self.leases.stop()
        await self.ledger.stop_batches()  # a batch out now: its callers are gone

    # ---------------------------------------------------------------- attempts

    async def run_attempt(self, ref: str, attempt: int, delivery: str | None = None) -> str:
        """:meth:`Runtime.run_attempt <toolq.services.tasks.run.Runtime.run_attempt>`."""
        holder = self.leases.new_holder()
        try:
            claim = await _claimed(
                ref,
                attempt,
                self.sync.claim_patience_s,
                lambda: self.ledger.claim(
                    ref,
                    attempt,
                    holder,
                    self.now_ms(),
                    self.lease_ms,
                    "run",
                    ack=delivery,
                    limits=self.sync.dep_limits,
                ),
            )
        except NotDurable:
            log.warning(
                "%s attempt %d: claim not confirmed on disk or by a replica; left queued",
                ref,
                attempt,
            )
            await self._give_back(ref, attempt, holder, delivery)
            return Delivery.NOT_DURABLE
        if claim.outcome == Claimed.HELD:
            return await self._held(ref, attempt, claim, holder, delivery)
        if claim.outcome != Claimed.CLAIMED:
            log.info(
                "delivery of %s attempt %d refused: %s", ref, attempt, claim.state or claim.outcome
            )
            return Delivery(claim.outcome.value)
        if claim.tool not in self.registry:
            log.error("tool %s is not registered in this worker; %s left queued", claim.tool, ref)
            await self._give_back(ref, attempt, holder, delivery)
            return Delivery.UNKNOWN_TOOL
        tool = self.registry.get(claim.tool)
        a = outcome.Attempt(
            ref=ref,
            tool=tool,
            call_id=claim.call_id,
            attempt=attempt,
            max_attempts=claim.max_attempts,
            deadline_ms=claim.deadline_ms,
            fp=claim.fp,
            vcheck=claim.vcheck,
            holder=holder,
        )
        refused = outcome.before_call(a, self.now_ms(), self.policy)
        if refused is not None:
            log.warning("%s attempt %d not started: %s", ref, attempt, refused.code)
            with _traced(tool, ref, claim, attempt):
                return await self._record(refused, delivery)
        ctx = self.sync._context(ref, tool, claim, attempt)
        with _traced(tool, ref, claim, attempt), self.leases.hold(ref, attempt, "run", holder):
            try:
                result = await self._invoke(tool, ctx)
                t = outcome.after_success(a, result, self.now_ms(), self.policy)
            except Exception as exc:
                _log_failure(tool.name, ref, attempt, exc)
                m = self.sync.messages_for(tool.name)
                t = outcome.after_failure(a, exc, self.now_ms(), self.policy, m, self.sync.rng)
            return await self._record(t, delivery)

    async def _invoke(self, tool: Tool[Any], ctx: CallContext) -> Any:
        if tool.is_async:
            return await tool.ainvoke(ctx.args, ctx)
        return await self.blocking(lambda: tool.invoke(ctx.args, ctx))

    async def _held(
        self, ref: str, attempt: int, claim: Claim, holder: str, delivery: str | None
    ) -> str:
        """:meth:`Runtime._held <toolq.services.tasks.run.Runtime._held>`."""
        lasts = claim.lease_until_ms > self.now_ms()
        if lasts and not holder_is_dead(claim.holder):
            log.info(
                "duplicate delivery of %s attempt %d dropped (held by a live worker)", ref, attempt
            )
            return Delivery.DUPLICATE
        tool = self.registry.get(claim.tool) if claim.tool in self.registry else None
        fields = await _claimed(
            ref,
            attempt,
            self.sync.claim_patience_s,
            lambda: self.ledger.fields(ref, "deadline", tracing.FIELD),
        )
        lost = outcome.Lost(
            ref=ref,
            tool=tool,
            tool_name=claim.tool,
            call_id=claim.call_id,
            attempt=attempt,
            max_attempts=claim.max_attempts,
            deadline_ms=int(float(fields.get("deadline") or 0)),
            vcheck=claim.vcheck,
            expect={"running": {"attempt": str(attempt), "lease_holder": claim.holder}},
            by=f"{holder}:redelivery",
        )
        t = outcome.lease_lost(lost, self.now_ms(), self.policy, self.sync.messages_for(claim.tool))
        with tracing.recovered(claim.tool, ref, attempt, fields.get(tracing.FIELD, ""), lost.by):
            res = await self._record(t, delivery)
        log.warning("%s attempt %d: %s; %s", ref, attempt, holder_gone(lasts), t.to)
        return res

    async def _give_back(self, ref: str, attempt: int, holder: str, delivery: str | None) -> None:
        """:meth:`Runtime._give_back <toolq.services.tasks.run.Runtime._give_back>`."""
        await self._record(
            Transition(
                ref=ref,
                states=(State.RUNNING,),
                to=State.QUEUED,
                by=holder,
                expect={"running": {"attempt": str(attempt), "lease_holder": holder}},
                delete=("lease_holder", "lease_until"),
                due_ms=self.now_ms() + self.policy.unclaimed_after_ms,
            ),
            delivery,
        )

    # ---------------------------------------------------------------- verification

    async def run_check(
        self, ref: str, attempt: int, vcheck: int, delivery: str | None = None
    ) -> str:
        """:meth:`Runtime.run_check <toolq.services.tasks.run.Runtime.run_check>`."""
        holder = self.leases.new_holder()
        claim = await _claimed(
            ref,
            attempt,
            self.sync.claim_patience_s,
            lambda: self.ledger.claim(
                ref, attempt, holder, self.now_ms(), self.lease_ms, "verify", vcheck, delivery
            ),
        )
        if claim.outcome != Claimed.CLAIMED:
            return claim.outcome
        if claim.tool not in self.registry:
            log.error(
                "tool %s is not registered in this worker; %s not verified here", claim.tool, ref
            )
            if delivery:
                tag = delivery
                await _claimed(
                    ref, attempt, self.sync.claim_patience_s, lambda: self.ledger.ack(tag)
                )
            return Delivery.UNKNOWN_TOOL
        tool = self.registry.get(claim.tool)
        c = outcome.Check(
            ref=ref,
            tool=tool,
            call_id=claim.call_id,
            attempt=attempt,
            max_attempts=claim.max_attempts,
            deadline_ms=claim.deadline_ms,
            vcheck=vcheck,
            vfail=claim.vfail,
            uncertain_at_ms=claim.uncertain_at_ms,
            holder=holder,
        )
        ctx = self.sync._context(ref, tool, claim, attempt)
        traced = tracing.check(tool.name, ref, attempt, vcheck, claim.trace, claim.call_id)
        with traced, self.leases.hold(ref, attempt, "verify", holder):
            try:
                if tool.verifier_is_async:
                    found = await tool.alookup(ctx)
                else:
                    found = await self.blocking(lambda: tool.lookup(ctx))
            except Exception as exc:
                log.warning("verifier of %s failed for %s", tool.name, ref, exc_info=True)
                detail = safe_words(exc, tool.options.safe_details)
                t = outcome.verifier_failed(c, self.now_ms(), self.policy, detail)
            else:
                if found is None:
                    m = self.sync.messages_for(tool.name)
                    t = outcome.verified_not_found(c, self.now_ms(), self.policy, m)
                else:
                    t = outcome.verified_found(c, found, self.now_ms(), self.policy)
            res = await self._record(t, delivery)
            if res == t.to and not t.quiet:
                self.sync._observe_recovery(tool.name, (self.now_ms() - c.uncertain_at_ms) / 1000)
            return res

    # ---------------------------------------------------------------- recording

    async def _record(self, t: Transition, delivery: str | None = None) -> str:
        at = self.now_ms()  # when it was decided: a step after it starts later
        patience_s = self.sync.record_patience_s
        try:
            res = await _patient(
                lambda: self.ledger.apply_one(t, self.now_ms(), delivery), patience_s
            )
        except AWAY as exc:
            raise RecordAway(t, exc, patience_s) from exc
        tracing.current().recorded(t, res, at)  # the attempt's or the check's span, if traced
        if res != "ok":
            log.info("%s -> %s refused by the ledger (now %s)", t.ref, t.to, res)
            return f"{REFUSED}{res}"
        return Outcome(t.to, t.code)


async def _claimed(ref: str, attempt: int, patience_s: float, fn: Callable[[], Awaitable[T]]) -> T:
    """:func:`toolq.services.tasks.run._claimed`, awaited."""
    try:
        return await _patient(fn, patience_s)
    except AWAY as exc:
        raise LedgerAway(ref, attempt, exc, patience_s) from exc


async def _patient(fn: Callable[[], Awaitable[T]], patience_s: float) -> T:
    """:func:`toolq.services.tasks.run._patient`, awaited (the loop goes on meanwhile).

    The patience counts from the first failure, not from the first try: a try that
    waited on the loop (a tool holding it, thousands of calls before it for one of
    the loop's connections) and then timed out says the loop was busy, not that the
    server is away; the next try finds it answering."""
    deadline: float | None = None
    delay = 0.05
    while True:
        try:
            return await fn()
        except AWAY:
            now = time.monotonic()
            if deadline is None:
                deadline = now + patience_s
            if now + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
