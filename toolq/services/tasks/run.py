"""The Celery task bodies: claim, call, record. Thin on purpose.

A body claims its attempt in the ledger before it calls the tool, holds a
lease while the tool runs, and records the envelope after. A delivery whose
attempt is already claimed does not call the tool: if the holder is alive it
is dropped; if the holder died or its lease expired, a write goes to
verification and a read runs again. A claim that cannot reach the ledger's server
raises :class:`LedgerAway`: the tool was not called, and the task body gives the
delivery back to its queue (:mod:`toolq.client.app`). A record (the outcome after the
tool ran, or a hand-back) that cannot reach it raises :class:`RecordAway`: the delivery
goes back to its queue too, its attempt stays as the ledger has it (``running``, its
lease no longer renewed), and the lease's expiry settles it as any unknown outcome (a
write is verified, a read runs again); the copy's claim finds it held and never calls
the tool.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import redis

from toolq.adapters.broker.messages import REFUSED, Delivery, Outcome
from toolq.adapters.ledger.replies import Claimed
from toolq.adapters.ledger.store import Claim, Ledger
from toolq.adapters.notify import ProgressPublisher
from toolq.adapters.observe import observe_recovery
from toolq.core.errors import NotDurable, ToolFailure, safe_words
from toolq.core.record import ms_to_dt
from toolq.core.states import State
from toolq.core.tools import CallContext, Registry, Tool
from toolq.decisions.recovery import outcome
from toolq.decisions.recovery.transition import Transition
from toolq.process import tracing
from toolq.services.tasks.leases import LeaseKeeper, holder_is_dead

log = logging.getLogger("toolq.worker")

T = TypeVar("T")

#: What a ledger call raises while the ledger's server is away (or a Cluster's node
#: is, before its failover): retried with backoff by :func:`_patient`.
AWAY = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,  # a ConnectionError; named for the reader
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)


class LedgerAway(Exception):
    """A delivery could not claim its attempt: the ledger's server did not answer
    within the claim's patience (``worker.claim_patience_s``). The tool was not called.
    Raised from the redis error; the task body turns it into a requeue of the delivery.

    (The claim may have been written and its reply lost: the copy then finds the
    attempt held by this process, and the lease sweep settles it, as before.)
    """

    def __init__(self, ref: str, attempt: int, cause: BaseException, patience_s: float) -> None:
        super().__init__(
            f"{ref} attempt {attempt}: the ledger's server did not take the claim within "
            f"{patience_s:g} s ({type(cause).__name__}); the tool was not called"
        )


class RecordAway(Exception):
    """A delivery's record (its outcome, after the tool ran; or a claim given back)
    could not be written: the ledger's server did not answer within the record's
    patience (``worker.record_patience_s``). Raised from the redis error; the task body turns it
    into a requeue of the delivery, as :class:`LedgerAway`.

    The attempt stays as the ledger has it: ``running`` under this delivery's lease,
    which is no longer renewed. Once it runs out, the lease sweep (or the copy's
    claim, which finds it held, not claimable) settles it as an unknown outcome: a
    write goes to verification, a read runs again. The tool is never called again
    for this attempt. (The record may have been written and its reply lost: the copy
    then finds the new state and is refused.)
    """

    def __init__(self, t: Transition, cause: BaseException, patience_s: float) -> None:
        super().__init__(
            f"{t.ref} -> {t.to}: the ledger's server did not take the record within "
            f"{patience_s:g} s ({type(cause).__name__}); the lease's expiry settles it"
        )


class Runtime:
    def __init__(
        self,
        registry: Registry,
        ledger: Ledger,
        messages: outcome.Messages,
        policy: outcome.Policy,
        lease_ms: int,
        clock: Callable[[], float] = time.time,
        *,
        renew_every: float,
        claim_patience_s: float,
        record_patience_s: float,
        messages_for: Callable[[str], outcome.Messages] | None = None,
    ) -> None:
        self.registry = registry
        self.ledger = ledger
        self.messages = messages
        #: One tool's message builders (its messages name it, for Flower); else ``messages``.
        self.messages_for = messages_for or (lambda _tool: messages)
        self.policy = policy
        self.lease_ms = lease_ms
        self.clock = clock
        #: How long a claim, and a record, keep trying while the ledger's server is
        #: away (``worker.claim_patience_s``, ``worker.record_patience_s``).
        self.claim_patience_s = claim_patience_s
        self.record_patience_s = record_patience_s
        self.leases = LeaseKeeper(ledger, lease_ms, clock, renew_every=renew_every)
        # Each notice goes to the steps channel of its ref's cell (the single tag: its own).
        self.progress = ProgressPublisher(
            ledger.redis, lambda ref: ledger.keys_of(ref).notify_steps
        )
        self.rng = random.Random()
        #: The dependency limits every claim passes (toolq.core.deps.limits_table): the
        #: registry's (tq.limit) under the settings' (App sets it; "" for none).
        self.dep_limits = ""

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---------------------------------------------------------------- attempts

    def run_attempt(self, ref: str, attempt: int, delivery: str | None = None) -> str:
        """Serve one delivery of ``toolq.run``; returns what happened (for logs and tests).

        ``delivery``: its Celery delivery tag, when the ledger's server is the broker
        too. The ledger call that ends the delivery (a refused claim, or the record)
        then acknowledges it in the same step, and the worker's own ack sends nothing
        (:mod:`toolq.adapters.broker.transport`): one round trip less per call.
        """
        holder = self.leases.new_holder()
        try:
            claim = _claimed(
                ref,
                attempt,
                self.claim_patience_s,
                lambda: self.ledger.claim(
                    ref,
                    attempt,
                    holder,
                    self.now_ms(),
                    self.lease_ms,
                    "run",
                    ack=delivery,
                    limits=self.dep_limits,
                ),
            )
        except NotDurable:
            # The server took the claim but did not confirm it on disk (or, on a Cluster,
            # on a replica): a power loss or a failover could still undo it and let
            # another delivery run the tool again. Not called; the attempt goes back to
            # queued (if that is lost too, or the lease ran out meanwhile, the lease
            # sweep takes it).
            log.warning(
                "%s attempt %d: claim not confirmed on disk or by a replica; left queued",
                ref,
                attempt,
            )
            self._give_back(ref, attempt, holder, delivery)
            return Delivery.NOT_DURABLE
        if claim.outcome == Claimed.HELD:
            return self._held(ref, attempt, claim, holder, delivery)
        if claim.outcome != Claimed.CLAIMED:
            log.info(
                "delivery of %s attempt %d refused: %s", ref, attempt, claim.state or claim.outcome
            )
            return Delivery(claim.outcome.value)
        tool = self._tool_or_release(ref, attempt, claim, holder, delivery)
        if tool is None:
            return Delivery.UNKNOWN_TOOL
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
            # Delivered past the deadline (late, or after a long queue): never call the tool.
            log.warning("%s attempt %d not started: %s", ref, attempt, refused.code)
            with _traced(tool, ref, claim, attempt):
                return self._record(refused, delivery)
        ctx = self._context(ref, tool, claim, attempt)
        with _traced(tool, ref, claim, attempt), self.leases.hold(ref, attempt, "run", holder):
            try:
                result = tool.invoke(ctx.args, ctx)  # awaited here if the tool is async
                t = outcome.after_success(a, result, self.now_ms(), self.policy)
            except Exception as exc:
                _log_failure(tool.name, ref, attempt, exc)
                t = outcome.after_failure(
                    a, exc, self.now_ms(), self.policy, self.messages_for(tool.name), self.rng
                )
            return self._record(t, delivery)

    def _held(self, ref: str, attempt: int, claim: Claim, holder: str, delivery: str | None) -> str:
        """Another process claimed this attempt. Drop the copy, unless that process is gone."""
        lasts = claim.lease_until_ms > self.now_ms()
        if lasts and not holder_is_dead(claim.holder):
            log.info(
                "duplicate delivery of %s attempt %d dropped (held by a live worker)", ref, attempt
            )
            return Delivery.DUPLICATE
        tool = self.registry.get(claim.tool) if claim.tool in self.registry else None
        # A "held" claim does not carry the deadline; a read that runs again needs it
        # (rare: only when the holder died), and it never changes, so a plain read will do.
        # Nothing is recorded yet: a server away here sends the delivery back too.
        f = _claimed(
            ref,
            attempt,
            self.claim_patience_s,
            lambda: self.ledger.fields(ref, "deadline", tracing.FIELD),
        )
        deadline = f.get("deadline")
        lost = outcome.Lost(
            ref=ref,
            tool=tool,
            tool_name=claim.tool,
            call_id=claim.call_id,
            attempt=attempt,
            max_attempts=claim.max_attempts,
            deadline_ms=int(float(deadline or 0)),
            vcheck=claim.vcheck,
            expect={"running": {"attempt": str(attempt), "lease_holder": claim.holder}},
            by=f"{holder}:redelivery",
        )
        t = outcome.lease_lost(lost, self.now_ms(), self.policy, self.messages_for(claim.tool))
        with tracing.recovered(claim.tool, ref, attempt, f.get(tracing.FIELD, ""), lost.by):
            res = self._record(t, delivery)
        log.warning("%s attempt %d: %s; %s", ref, attempt, holder_gone(lasts), t.to)
        return res

    def _tool_or_release(
        self, ref: str, attempt: int, claim: Claim, holder: str, delivery: str | None
    ) -> Tool[Any] | None:
        if claim.tool in self.registry:
            return self.registry.get(claim.tool)
        # This worker was started without the tool: give the attempt back untouched.
        log.error("tool %s is not registered in this worker; %s left queued", claim.tool, ref)
        self._give_back(ref, attempt, holder, delivery)
        return None

    def _give_back(self, ref: str, attempt: int, holder: str, delivery: str | None) -> None:
        """Return a claimed attempt to ``queued`` untouched; the scheduler republishes it."""
        self._record(
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

    def _context(self, ref: str, tool: Tool[Any], claim: Claim, attempt: int) -> CallContext:
        return CallContext(
            operation_ref=ref,
            tool=tool.name,
            call_id=claim.call_id or None,
            attempt=attempt,
            max_attempts=claim.max_attempts,
            approved=bool(claim.approved_fp) and claim.approved_fp == claim.fp,
            args=tool.args_model.model_validate_json(claim.args),
            deadline=ms_to_dt(claim.deadline_ms) if claim.deadline_ms else None,
            progress_cb=self.progress.reporter(ref),
        )

    # ---------------------------------------------------------------- verification

    def run_check(self, ref: str, attempt: int, vcheck: int, delivery: str | None = None) -> str:
        """Serve one delivery of ``toolq.verify``: look the operation up, record the
        verdict (``delivery``: as in :meth:`run_attempt`)."""
        holder = self.leases.new_holder()
        claim = _claimed(
            ref,
            attempt,
            self.claim_patience_s,
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
            if delivery:  # nothing recorded: acknowledged on its own (its lease runs out)
                _claimed(ref, attempt, self.claim_patience_s, lambda: self.ledger.ack(delivery))
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
        ctx = self._context(ref, tool, claim, attempt)
        traced = tracing.check(tool.name, ref, attempt, vcheck, claim.trace, claim.call_id)
        with traced, self.leases.hold(ref, attempt, "verify", holder):
            try:
                # A worker whose tool lost its verifier fails the check: bounded, then escalated.
                found = tool.lookup(ctx)
            except Exception as exc:
                log.warning("verifier of %s failed for %s", tool.name, ref, exc_info=True)
                detail = safe_words(exc, tool.options.safe_details)
                t = outcome.verifier_failed(c, self.now_ms(), self.policy, detail)
            else:
                if found is None:
                    m = self.messages_for(tool.name)
                    t = outcome.verified_not_found(c, self.now_ms(), self.policy, m)
                else:
                    t = outcome.verified_found(c, found, self.now_ms(), self.policy)
            res = self._record(t, delivery)
            if res == t.to and not t.quiet:
                self._observe_recovery(tool.name, (self.now_ms() - c.uncertain_at_ms) / 1000)
            return res

    @staticmethod
    def _observe_recovery(tool: str, seconds: float) -> None:
        """Time an operation spent verifying, for the metrics histogram (this process only)."""
        observe_recovery(tool, seconds, state="verifying")

    # ---------------------------------------------------------------- recording

    def _record(self, t: Transition, delivery: str | None = None) -> str:
        at = self.now_ms()  # when it was decided: a step after it starts later
        try:
            res = _patient(
                lambda: self.ledger.apply_one(t, self.now_ms(), delivery), self.record_patience_s
            )
        except AWAY as exc:
            raise RecordAway(t, exc, self.record_patience_s) from exc
        tracing.current().recorded(t, res, at)  # the attempt's or the check's span, if traced
        if res != "ok":
            log.info("%s -> %s refused by the ledger (now %s)", t.ref, t.to, res)
            return f"{REFUSED}{res}"
        return Outcome(t.to, t.code)  # with its code, for what Flower shows


def holder_gone(lease_lasts: bool) -> str:
    """Why a delivery takes over an attempt another holder claimed (its log line): the
    holder's process is gone from this host while its lease lasts, or the lease ran out,
    as it does too for a worker that lived but lost the ledger's server mid-call (its
    delivery given back unrecorded: :class:`RecordAway`)."""
    if lease_lasts:
        return "its worker died mid-call"
    return "its lease ran out (its worker died or lost the ledger's server mid-call)"


def _traced(tool: Tool[Any], ref: str, claim: Claim, attempt: int) -> AbstractContextManager[Any]:
    """The attempt's span (``execute_tool {tool}``), a child of the submitter's context."""
    return tracing.attempt(tool.name, ref, attempt, claim.trace, claim.call_id)


def _log_failure(tool: str, ref: str, attempt: int, exc: Exception) -> None:
    """A failure the tool reported on purpose is routine: one line, its code and its
    message for logs (scrubbed; ``RESULT_TOO_LARGE: the result's JSON is ... bytes``).
    Anything else gets its traceback, in the log only (keyed by operation_ref, never in
    an envelope)."""
    if isinstance(exc, ToolFailure):
        log.info("tool %s: %s attempt %d: %s", tool, ref, attempt, exc)
    else:
        log.warning(
            "tool %s failed unexpectedly for %s attempt %d", tool, ref, attempt, exc_info=exc
        )


def _claimed(ref: str, attempt: int, patience_s: float, fn: Callable[[], T]) -> T:
    """:func:`_patient` for what a delivery does before it calls anything (its claim):
    the server still away after ``patience_s`` raises :class:`LedgerAway`."""
    try:
        return _patient(fn, patience_s)
    except AWAY as exc:
        raise LedgerAway(ref, attempt, exc, patience_s) from exc


def _patient(fn: Callable[[], T], patience_s: float) -> T:
    """Call ``fn``, retrying connection errors with backoff for up to ``patience_s``
    from the first failure (a first try that took long and then failed, a server
    stalled rather than away, still gets its retries).

    Every ledger call is a compare-and-set, so a repeat after a lost reply is safe.
    """
    deadline: float | None = None
    delay = 0.05
    while True:
        try:
            return fn()
        except AWAY:
            now = time.monotonic()
            if deadline is None:
                deadline = now + patience_s
            if now + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
