"""``tq.aio``: the client for asyncio programs (agent runtimes, the HTTP API, MCP).

    env = await tq.aio.call("create_invoice", {...}, operation_ref="run_81/step_4")

The sync client's names and semantics (:class:`toolq.client.queue.ToolQueue`), on
``redis.asyncio``, sharing ``tq.app`` (tools, settings, Celery messages):

- A wait costs no thread and no polling: it registers with its loop's one
  notice subscription (:class:`toolq.adapters.notify.AsyncNotifier`), reads the record
  once, and sleeps until a notice of its ref arrives. A notice carries the
  state, the revision and the envelope, so a settled call needs no second
  read. If no notice came for :data:`toolq.calls.FALLBACK_READ_S` it reads
  once more, in case one was lost.
- Connections belong to the event loop they were made on (:mod:`toolq.client.loops`):
  each running loop gets its own pool, ledger and subscription (made on first use, closed by
  :meth:`AsyncToolQueue.aclose` or when the loop shuts down and cancels its
  tasks, as ``asyncio.run``, ``anyio.run`` and servers do). Several loops in
  several threads can share one ``tq.aio``.
- A Redis restart mid-wait: the subscription comes back and wakes every
  waiter to read its record again (on connections opened again where the restart
  closed them: :class:`toolq.adapters.aio_packing.HiredisPacking`). A server that
  cannot be reached when a call starts is
  :class:`toolq.core.errors.ServerUnavailable`, as in the sync client.
- Cancelling the task that awaits a wait (or a call) ends the wait only; the
  operation goes on, and can be waited for again by its ref.
- Fair to the rest of the loop: at most :data:`CALLS_PER_PASS` calls begin in
  one pass of the loop, at most :data:`CONNECTIONS_PER_LOOP` connections carry
  the commands, and the subscription wakes waiters in batches, so 1,000 calls
  started at once do not hold the loop (bench/aio_bench.py measures it). The
  first use in a process freezes the import-time heap (:mod:`toolq.process.heap`), so a
  full garbage collection does not walk Celery, kombu and pydantic on the loop.

- On a Valkey/Redis Cluster (:class:`toolq.topology.nodes.ClusterNodes`) the loop's
  client is :class:`toolq.adapters.ledger.cluster.AsyncLedgerCluster`: every call goes to the node
  of its ref's cell, and the notice subscription holds a connection to each
  primary that serves some of the cells (:class:`toolq.adapters.notify.AsyncSubscription`).

Runs on asyncio (and anyio's asyncio backend); redis.asyncio has no trio support.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import redis.asyncio as aioredis

from toolq.adapters.ledger import lists
from toolq.adapters.notify import Event, Progress, Waiter
from toolq.adapters.outage import (
    MISUSE,
    UNREACHABLE,
    note_away,
    server_errors,
    translated,
    unavailable,
)
from toolq.client.app import App
from toolq.client.deps import AsyncDeps
from toolq.client.loops import CALLS_PER_PASS as CALLS_PER_PASS
from toolq.client.loops import CLUSTER_SPARE_CONNECTIONS as CLUSTER_SPARE_CONNECTIONS
from toolq.client.loops import CONNECTIONS_PER_LOOP as CONNECTIONS_PER_LOOP
from toolq.client.loops import Bound as _Bound
from toolq.client.loops import Loops
from toolq.client.loops import Turns as Turns
from toolq.core import errors
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.record import HistoryEntry, OperationPage, OperationRecord, load_envelope
from toolq.core.states import SETTLED, State
from toolq.decisions import operations
from toolq.decisions.operations import FALLBACK_READ_S, WAIT_FIELDS, Seen, Submission
from toolq.decisions.recovery import operator
from toolq.decisions.recovery.transition import Transition
from toolq.process import logs, tracing

OnProgress = Callable[[Progress], Awaitable[None] | None]

#: What a read that fails while the server is away raises: a wait keeps waiting.
_AWAY: tuple[type[Exception], ...] = (*UNREACHABLE, OSError)


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """What :meth:`AsyncToolQueue.watch` yields: one state entered, or one progress report.

    ``kind="state"``: ``state``, ``rev``, ``seq`` (the 1-based index of its history
    entry) and ``envelope``, the envelope that transition wrote as the model
    (``ToolSuccess``/``ToolError``; None when it wrote none). ``kind="progress"``:
    ``progress`` only. ``envelope_json`` is the envelope as the ledger stored it
    ("" when none), what ``envelope`` held in earlier releases; ``load_envelope``
    accepts either.
    """

    kind: Literal["state", "progress"]
    state: State | None = None
    rev: int = 0
    progress: Progress | None = None
    envelope: ToolSuccess | ToolError | None = None
    seq: int = 0
    ref: str = ""
    envelope_json: str = ""

    @classmethod
    def of(cls, ev: Event) -> WatchEvent:
        """The notice as a watcher sees it: its envelope parsed, once, here."""
        return cls(
            kind=ev.kind,
            state=ev.state,
            rev=ev.rev,
            progress=ev.progress,
            envelope=load_envelope(ev.envelope) if ev.envelope else None,
            seq=ev.seq,
            ref=ev.ref,
            envelope_json=ev.envelope,
        )


class AsyncToolQueue:
    """``tq.aio``: submit, wait, get, call and operator actions, awaited."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._loops = Loops(app)

    def __repr__(self) -> str:
        return f"<AsyncToolQueue {self.app.name} loops={len(self._bound_to)}>"

    # ------------------------------------------------------------------ this loop's connections

    @property
    def _bound_to(self) -> dict[asyncio.AbstractEventLoop, _Bound]:
        """Each loop's connections (tests and the bench read a loop's notifier here)."""
        return self._loops.bound_to

    async def _bound(self) -> _Bound:
        """This loop's connections, once it is this caller's turn (see :class:`Turns`)."""
        return await self._loops.bound()

    async def aclose(self) -> None:
        """Close this loop's connections and subscription (others close with their loop)."""
        b = self._loops.current()
        if b is not None:
            await b.aclose()

    @server_errors
    async def ping(self) -> None:
        """Returns if this loop reaches Redis; :class:`errors.ServerUnavailable` if not."""
        await (await self._bound()).ledger.ping()

    async def client(self) -> aioredis.Redis:
        """This loop's Redis client, for read-only views (:mod:`toolq.edges.monitor`, the
        console)."""
        return (await self._bound()).redis

    @property
    def deps(self) -> AsyncDeps:
        """The dependency keys, awaited (:mod:`toolq.client.deps`)."""
        return AsyncDeps(self.app, self.client)

    def watching(self) -> int:
        """Waits and watches registered on this loop (0 once they all ended)."""
        b = self._loops.current()
        return 0 if b is None else b.notifier.watching()

    # ------------------------------------------------------------------ submit and call

    @server_errors
    async def submit(
        self,
        tool: str,
        args: Any,
        *,
        operation_ref: str | None = None,
        call_id: str | None = None,
        run_id: str | None = None,
        step: str | int | None = None,
    ) -> Submission:
        """Enqueue a call; as :meth:`toolq.client.queue.ToolQueue.submit`."""
        b = await self._bound()
        with tracing.submitting(tool) as span:
            op = self.app.new_operation(
                tool,
                args,
                operation_ref=operation_ref,
                call_id=call_id,
                run_id=run_id,
                step=step,
                trace=span.carrier(),
            )
            res = await b.ledger.submit(**op.ledger_args())
            span.submitted(op.ref, res.state, res.outcome == "created", op.now_ms)
        sub = operations.submitted(op, res.outcome, res.state)
        warnings = await self.app.liveness.acheck(b.redis, self.app.queue_of(op))
        return Submission(sub.operation_ref, sub.state, sub.created, warnings)

    async def call(
        self,
        tool: str,
        args: Any,
        *,
        operation_ref: str | None = None,
        call_id: str | None = None,
        timeout: float = 30.0,
        on_progress: OnProgress | None = None,
    ) -> ToolSuccess | ToolError:
        """Submit and wait in one: the envelope (as :meth:`wait`)."""
        deadline = asyncio.get_running_loop().time() + operations.wait_seconds(timeout)
        try:
            b = await self._bound()
            with tracing.submitting(tool) as span:
                op = self.app.new_operation(
                    tool, args, operation_ref=operation_ref, call_id=call_id, trace=span.carrier()
                )
                # Watch before submitting: every notice after the creation is heard, so a
                # created operation needs no first read (revision 1 is what was written).
                w = await b.notifier.watch(op.ref, progress=on_progress is not None)
                try:
                    res = await b.ledger.submit(**op.ledger_args())
                except BaseException:
                    b.notifier.unwatch(op.ref, w)
                    raise
                span.submitted(op.ref, res.state, res.outcome == "created", op.now_ms)
            try:
                sub = operations.submitted(op, res.outcome, res.state)
                seen = Seen.created(op) if sub.created else None
                return await self._wait(b, w, op.ref, deadline, on_progress, seen)
            finally:
                b.notifier.unwatch(op.ref, w)
        except UNREACHABLE as exc:
            raise self._unavailable(exc) from exc

    # ------------------------------------------------------------------ read and wait

    @server_errors
    async def get(self, ref: str) -> OperationRecord | None:
        """The operation's record (state, attempt, envelope, history), or None."""
        if not self.app.settings.limits.is_ref(ref):
            return None
        return await (await self._bound()).ledger.get(ref)

    @server_errors
    async def history(self, ref: str, after: int = 0) -> list[HistoryEntry]:
        """The history entries after the first ``after`` (entry ``n`` is an event's ``seq``).

        A reader that saw up to ``seq`` resumes with ``history(ref, after=seq)``.
        """
        self._require(ref)
        return await (await self._bound()).ledger.history(ref, after)

    async def wait(
        self, ref: str, timeout: float = 30.0, *, on_progress: OnProgress | None = None
    ) -> ToolSuccess | ToolError:
        """Until the operation needs nothing more from the runtime; as ``ToolQueue.wait``.

        On timeout, the current envelope if it has one (``OUTCOME_UNKNOWN`` while
        verifying, ``RATE_LIMITED`` while waiting to retry); ``TimeoutError`` if
        none. ``on_progress`` (plain or async) gets what the tool reports meanwhile;
        an exception it raises ends the wait.
        """
        deadline = asyncio.get_running_loop().time() + operations.wait_seconds(timeout)
        self._require(ref)
        try:
            b = await self._bound()
            w = await b.notifier.watch(ref, progress=on_progress is not None)
            try:
                return await self._wait(b, w, ref, deadline, on_progress, None)
            finally:
                b.notifier.unwatch(ref, w)
        except UNREACHABLE as exc:
            raise self._unavailable(exc) from exc

    def _on_cluster(self) -> bool:
        return self.app.topology.on_cluster

    def _unavailable(self, exc: Exception) -> errors.ServerUnavailable:
        """What :func:`toolq.adapters.outage.server_errors` says, for the two calls that stay
        pending: a try block costs a pending wait nothing, the decorator ~1 KiB."""
        if isinstance(exc, MISUSE):
            raise exc
        note_away(self)
        return unavailable(lambda: self.app.redis_url, exc, self._on_cluster)

    async def _wait(
        self,
        b: _Bound,
        w: Waiter,
        ref: str,
        deadline: float,
        on_progress: OnProgress | None,
        seen: Seen | None,
    ) -> ToolSuccess | ToolError:
        loop = asyncio.get_running_loop()
        if seen is None:
            seen = Seen.read(ref, await b.ledger.fields(ref, *WAIT_FIELDS))
        while (done := seen.result()) is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                seen = Seen.read(ref, await b.ledger.fields(ref, *WAIT_FIELDS))
                return seen.result() or seen.timed_out()
            heard = await w.wait(min(remaining, FALLBACK_READ_S))
            events, reread = w.take()
            for ev in events:
                if ev.progress is not None:
                    if on_progress is not None:
                        await _called(on_progress, ev.progress)
                elif ev.state is not None:
                    now = seen.heard(ev.state, ev.rev, ev.envelope)
                    reread = reread or now is None
                    seen = now or seen
            if reread or not heard:
                seen = await self._reread(b, ref, seen)
        return done

    async def _reread(self, b: _Bound, ref: str, seen: Seen) -> Seen:
        """Read the record; while the server is away, keep what was known (the
        subscription wakes everyone to read again once it is back)."""
        try:
            return Seen.read(ref, await b.ledger.fields(ref, *WAIT_FIELDS))
        except _AWAY:
            return seen

    async def watch(self, ref: str) -> AsyncIterator[WatchEvent]:
        """Every notice for ``ref``: first the state it is in now, then each state it
        enters (``seq`` numbers its history entry) and each progress report; ends
        after a settled state. ``OperationNotFound`` if there is no such operation.
        Each is a :class:`WatchEvent`: its ``envelope`` is the model (or None).

        Use ``contextlib.aclosing`` to stop watching before it ends.
        """
        self._require(ref)
        with translated(lambda: self.app.redis_url, self._on_cluster):
            b = await self._bound()
            w = await b.notifier.watch(ref, progress=True)
        try:
            with translated(lambda: self.app.redis_url, self._on_cluster):
                last = await self._now(b, ref)
            yield WatchEvent.of(last)
            while last.state not in SETTLED:
                heard = await w.wait(FALLBACK_READ_S)
                events, reread = w.take()
                for ev in events:
                    if last.state in SETTLED:
                        break
                    if ev.kind == "progress":
                        yield WatchEvent.of(ev)
                    elif ev.rev > last.rev:
                        last = ev
                        yield WatchEvent.of(ev)
                if (reread or not heard) and last.state not in SETTLED:
                    with contextlib.suppress(*_AWAY):
                        now = await self._now(b, ref)
                        if now.rev > last.rev:
                            last = now
                            yield WatchEvent.of(now)
        finally:
            b.notifier.unwatch(ref, w)

    async def _now(self, b: _Bound, ref: str) -> Event:
        """The state the operation is in, as an event (its seq: the history's length)."""
        f, seq = await b.ledger.state_of(ref)
        if "state" not in f:
            raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
        rev, env = int(f.get("rev") or 0), f.get("envelope", "")
        return Event("state", state=State(f["state"]), rev=rev, envelope=env, seq=seq, ref=ref)

    # ------------------------------------------------------------------ operator actions

    @server_errors
    async def approve(self, ref: str, *, by: str = "operator:approve") -> State:
        """Approve an operation awaiting approval, bound to its current arguments."""
        b, v = await self._view(ref, by)
        return await self._apply(b, self.app.approval(v, by))

    @server_errors
    async def provide_input(self, ref: str, args: Any, *, by: str = "operator:input") -> State:
        """Replace the arguments of an operation that needs input; identical ones are refused."""
        b, v = await self._view(ref, by)
        return await self._apply(b, self.app.new_input(v, args, by))

    @server_errors
    async def cancel(self, ref: str, *, by: str = "operator:cancel") -> State:
        """Cancel an operation that has not started a write (queued or waiting on someone)."""
        b, v = await self._view(ref, by)
        t = operator.cancel(v, self.app.policy, by)
        return State.CANCELLED if t is None else await self._apply(b, t)

    @server_errors
    async def retry_now(self, ref: str, *, by: str = "operator:retry") -> State:
        """Dispatch an operation waiting to retry now: the same operation_ref, one more
        attempt counted (escalated instead if its budget is spent). Only from waiting_retry."""
        b, v = await self._view(ref, by)
        return await self._apply(b, self.app.retry_now(v, by))

    @server_errors
    async def verify_now(self, ref: str, *, by: str = "operator:verify") -> State:
        """Check an operation in verifying now rather than at its next check."""
        b, v = await self._view(ref, by)
        return await self._apply(b, self.app.verify_now(v, by))

    @server_errors
    async def resolve(
        self,
        ref: str,
        outcome: str,
        *,
        reason: str,
        by: str = "operator:resolve",
        result: Any = None,
        reference: str = "",
        rev: str | int = "",
    ) -> State:
        """Settle an escalated operation after a person checked the provider.

        ``outcome``: ``committed`` (the write happened: ``succeeded``, with ``result``
        or ``reference`` as its result and ``evidence_ref`` ``operator:<by>``),
        ``not_committed`` (``failed``: nothing was written, nothing will be sent) or
        ``retry`` (nothing was written: one attempt more under the same operation_ref,
        at most ``recovery.operator_retries`` times). ``reason`` is required; ``rev``,
        the revision the operator read, refuses the action if the operation moved on
        (``StaleRevision``). Only from ``escalated``.
        """
        how = operator.Settle.parse(outcome)
        r = operator.Resolution(by=by, reason=reason, rev=str(rev), reference=reference)
        b, v = await self._view(ref, by)
        return await self._apply(b, self.app.resolution(v, how, r, result))

    # ------------------------------------------------------------------ lists

    @server_errors
    async def list_operations(
        self,
        state: str | None,
        *,
        tool: str | None = None,
        code: str | None = None,
        ref_contains: str | None = None,
        older_than_s: float | None = None,
        cursor: str | None = None,
        limit: int = lists.DEFAULT_LIMIT,
        newest_first: bool = False,
        search: str | None = None,
    ) -> OperationPage:
        """One page of the operations in ``state`` (None: every state), oldest first
        (see :mod:`toolq.adapters.ledger.lists`).

        Pass the page's ``next_cursor`` back for the next one (``prev_cursor`` for the
        one before). ``search``: a ref containing it, or a tool whose name contains it.
        A bad filter is :class:`errors.InvalidArguments` naming the fields.
        """
        q = self.app.list_query(
            state,
            tool=tool,
            code=code,
            ref_contains=ref_contains,
            older_than_s=older_than_s,
            cursor=cursor,
            limit=limit,
            newest_first=newest_first,
            search=search,
        )
        b = await self._bound()
        # Every cell's page, merged (the single tag: one cell, its page as it is).
        return await lists.aread_page_cells(b.redis, q, b.topology.layout.every_cell())

    async def _view(self, ref: str, by: str) -> tuple[_Bound, operator.View]:
        operator.check_actor(by)
        self._require(ref)
        b = await self._bound()
        return b, operator.View.from_fields(ref, await b.ledger.fields(ref, *operator.FIELDS))

    async def _apply(self, b: _Bound, t: Transition) -> State:
        # Traced: the action's span is a child of the submitter's context (one more read).
        stored = (await b.ledger.fields(t.ref, tracing.FIELD)) if tracing.enabled() else {}
        with logs.about(t.ref), tracing.operator(t, stored.get(tracing.FIELD, "")) as span:
            at = self.app.now_ms()
            answer = await b.ledger.apply_one(t, at)
            span.recorded(t, answer, at)
        return operations.applied(t, answer)

    # ------------------------------------------------------------------ refs

    def _require(self, ref: object) -> None:
        operations.require_existing(ref, self.app.settings.limits)


async def _called(fn: OnProgress, progress: Progress) -> None:
    result = fn(progress)
    if inspect.isawaitable(result):
        await result
