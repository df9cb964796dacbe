"""``ToolQueue``: the Python API agents and runtimes use.

tq = ToolQueue(redis_url="redis://127.0.0.1:6379/0")

@tq.tool(writes=True, consistency_window=2.0, max_attempts=5)
def create_invoice(args: CreateInvoice, ctx: CallContext) -> Invoice: ...

ref = tq.submit("create_invoice", {...}, operation_ref="run_81/step_4").operation_ref
env = tq.wait(ref, timeout=30.0)          # or both in one: tq.call(...)
env = await tq.aio.call("create_invoice", {...}, operation_ref="run_81/step_5")
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

import redis
from celery import Celery
from pydantic import ValidationError

from toolq.adapters.ledger import Ledger, lists
from toolq.adapters.notify import Wake
from toolq.adapters.outage import server_errors
from toolq.client.aio import AsyncToolQueue
from toolq.client.app import App
from toolq.client.deps import Deps
from toolq.core.deps import DEP_KEY_PATTERN, Limits, is_dep_key
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.record import OperationPage, OperationRecord
from toolq.core.settings import ToolqSettings
from toolq.core.states import State
from toolq.core.tools import Tool, ToolOptions, args_model_for
from toolq.decisions import operations
from toolq.decisions.operations import FALLBACK_READ_S, WAIT_FIELDS, Seen, Submission
from toolq.decisions.recovery import operator
from toolq.decisions.recovery.transition import Transition
from toolq.process import logs, tracing
from toolq.services.tasks.run import Runtime

R = TypeVar("R")


__all__ = ["Submission", "ToolQueue"]


class ToolQueue:
    """The client facade: register tools, submit calls, wait, act as an operator.

    Holds an :class:`~toolq.client.app.App` (``tq.app``): the settings, registry and
    connections that workers and the scheduler run on.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: ToolqSettings | None = None,
        name: str = "toolq",
        clock: Callable[[], float] = time.time,
        app: App | None = None,
    ) -> None:
        self.app = app or App(redis_url, settings=settings, name=name, clock=clock)
        self._aio = AsyncToolQueue(self.app)

    def __repr__(self) -> str:
        a = self.app
        url = a.settings.safe_url if a.settings.redis_url else "(no url yet)"
        return f"<ToolQueue {a.name} {url} tools={len(a.registry)}>"

    # ------------------------------------------------------------------ the app's parts

    @property
    def aio(self) -> AsyncToolQueue:
        """The async client on the same app: ``await tq.aio.call(...)``."""
        return self._aio

    @property
    def settings(self) -> ToolqSettings:
        return self.app.settings

    @property
    def name(self) -> str:
        return self.app.name

    @property
    def clock(self) -> Callable[[], float]:
        return self.app.clock

    @property
    def registry(self) -> Any:
        return self.app.registry

    @property
    def redis_url(self) -> str:
        return self.app.redis_url

    @property
    def redis(self) -> redis.Redis:
        return self.app.redis

    @property
    def ledger(self) -> Ledger:
        return self.app.ledger

    @property
    def celery(self) -> Celery:
        """The Celery app: ``celery -A module:celery_app worker`` serves every toolq queue."""
        return self.app.celery

    @property
    def deps(self) -> Deps:
        """The dependency keys: list, show, lift a pause, close a breaker
        (:mod:`toolq.client.deps`)."""
        return Deps(self.app)

    @property
    def runtime(self) -> Runtime:
        return self.app.runtime

    def configure(self, *, redis_url: str) -> None:
        """Point this ToolQueue (and its Celery app) at another server, before use."""
        self.app.configure(redis_url=redis_url)

    def close(self) -> None:
        self.app.close()

    def describe(self) -> dict[str, Any]:
        return self.app.describe()

    # ------------------------------------------------------------------ tools

    @overload
    def tool(self, fn: Callable[..., R], /) -> Tool[R]: ...

    @overload
    def tool(
        self, fn: None = None, /, *, name: str | None = None, **options: Any
    ) -> Callable[[Callable[..., R]], Tool[R]]: ...

    def tool(
        self, fn: Callable[..., R] | None = None, /, *, name: str | None = None, **options: Any
    ) -> Tool[R] | Callable[[Callable[..., R]], Tool[R]]:
        """Register a tool (``def`` or ``async def``): ``@tq.tool`` or ``@tq.tool(**options)``.

        ``options`` are :class:`~toolq.core.tools.ToolOptions` fields (defaults: a write,
        5 attempts, 1 h deadline, 2 s window); an unknown or bad one raises
        ``ValueError`` here, at registration.
        """
        opts = ToolOptions.parse(options, name)

        def register(f: Callable[..., R]) -> Tool[R]:
            # A callable object or a functools.partial has no __name__: name= names it.
            tool_name = name or getattr(f, "__name__", None)
            if not isinstance(tool_name, str) or not re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", tool_name
            ):
                raise ValueError(
                    f"tool name {tool_name!r} is not an identifier (name= gives one: "
                    "a letter or _, then letters, digits, _ . -, at most 64)"
                )
            t: Tool[R] = Tool(tool_name, f, args_model_for(f, tool_name), opts)
            self.registry.add(t)
            return t

        return register(fn) if fn is not None else register

    def limit(self, key: str, **limits: Any) -> Limits:
        """Declare a dependency key's limits (:class:`~toolq.core.deps.Limits` fields:
        ``rate="20/s"``, ``burst``, ``concurrency``, ``breaker_failures``,
        ``breaker_window``, ``breaker_open``); ``stripe`` also covers ``stripe:<any>``,
        each with its own limiter. The settings' ``dependencies`` override these field
        by field. A bad key or value raises ``ValueError`` here."""
        if not is_dep_key(key):
            raise ValueError(f"limit: {key[:80]!r} is not a dependency key ({DEP_KEY_PATTERN})")
        try:
            lim = Limits(**limits)
        except ValidationError as exc:
            raise ValueError(f"limit {key}: {exc.errors()[0]['msg']}") from None
        self.app.registry.limits[key] = lim
        return lim

    # ------------------------------------------------------------------ submit

    @server_errors  # an unreachable server: errors.ServerUnavailable
    def submit(
        self,
        tool: str,
        args: Any,
        *,
        operation_ref: str | None = None,
        call_id: str | None = None,
        run_id: str | None = None,
        step: str | int | None = None,
    ) -> Submission:
        """Enqueue a call; returns at once with its ``operation_ref``.

        The same ref with the same arguments returns the existing operation; with
        other arguments it raises :class:`errors.IdempotencyKeyReused`. Nothing is
        written when a submit is refused.
        """
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
            res = self.ledger.submit(**op.ledger_args())
            span.submitted(op.ref, res.state, res.outcome == "created", op.now_ms)
        sub = operations.submitted(op, res.outcome, res.state)  # (refused: raises here)
        # Built, not dataclasses.replace'd: replace costs more than the rest of this.
        return Submission(sub.operation_ref, sub.state, sub.created, self.app.warnings_for(op))

    @server_errors
    def call(
        self,
        tool: str,
        args: Any,
        *,
        operation_ref: str | None = None,
        call_id: str | None = None,
        timeout: float = 30.0,
    ) -> ToolSuccess | ToolError:
        """Submit and wait in one: the envelope (as :meth:`wait`)."""
        deadline = time.monotonic() + operations.wait_seconds(timeout)
        with tracing.submitting(tool) as span:
            op = self.app.new_operation(
                tool, args, operation_ref=operation_ref, call_id=call_id, trace=span.carrier()
            )
            # Watch before submitting: a created operation then needs no first read.
            ev = self.app.notifier.watch(op.ref)
            try:
                res = self.ledger.submit(**op.ledger_args())
            except BaseException:
                self.app.notifier.unwatch(op.ref, ev)
                raise
            span.submitted(op.ref, res.state, res.outcome == "created", op.now_ms)
        try:
            sub = operations.submitted(op, res.outcome, res.state)
            return self._wait(ev, op.ref, deadline, Seen.created(op) if sub.created else None)
        finally:
            self.app.notifier.unwatch(op.ref, ev)

    # ------------------------------------------------------------------ read

    @server_errors
    def get(self, ref: str) -> OperationRecord | None:
        """The operation's record (state, attempt, envelope, history), or None."""
        if not self.app.settings.limits.is_ref(ref):
            return None  # no operation has it (as ``tq.aio.get``)
        return self.ledger.get(ref)

    @server_errors
    def wait(self, ref: str, timeout: float = 30.0) -> ToolSuccess | ToolError:
        """Block until the operation needs nothing more from the runtime.

        On timeout, the current envelope if it has one (``OUTCOME_UNKNOWN`` while
        verifying, ``RATE_LIMITED`` while waiting to retry); ``TimeoutError`` if none.
        """
        deadline = time.monotonic() + operations.wait_seconds(timeout)
        self._require(ref)
        ev = self.app.notifier.watch(ref)
        try:
            return self._wait(ev, ref, deadline, None)
        finally:
            self.app.notifier.unwatch(ref, ev)

    def _wait(
        self, ev: Wake, ref: str, deadline: float, seen: Seen | None
    ) -> ToolSuccess | ToolError:
        """Sleep on the ref's notices; read only at first, when one was lost, and at the end."""
        if seen is None:
            seen = Seen.read(ref, self.ledger.fields(ref, *WAIT_FIELDS))
        while (done := seen.result()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = Seen.read(ref, self.ledger.fields(ref, *WAIT_FIELDS))
                return seen.result() or seen.timed_out()
            heard = ev.wait(min(remaining, FALLBACK_READ_S))
            notice, reread = ev.take()
            if notice is not None and notice.state is not None:
                now = seen.heard(notice.state, notice.rev, notice.envelope)
                reread = reread or now is None
                seen = now or seen
            if reread or not heard:
                seen = Seen.read(ref, self.ledger.fields(ref, *WAIT_FIELDS))
        return done

    # ------------------------------------------------------------------ operator actions

    @server_errors
    def approve(self, ref: str, *, by: str = "operator:approve") -> State:
        """Approve an operation awaiting approval, bound to its current arguments."""
        return self._apply(self.app.approval(self._view(ref, by), by))

    @server_errors
    def provide_input(self, ref: str, args: Any, *, by: str = "operator:input") -> State:
        """Replace the arguments of an operation that needs input; identical ones are refused."""
        return self._apply(self.app.new_input(self._view(ref, by), args, by))

    @server_errors
    def cancel(self, ref: str, *, by: str = "operator:cancel") -> State:
        """Cancel an operation that has not started a write (queued or waiting on someone)."""
        t = operator.cancel(self._view(ref, by), self.app.policy, by)
        return State.CANCELLED if t is None else self._apply(t)

    @server_errors
    def retry_now(self, ref: str, *, by: str = "operator:retry") -> State:
        """Dispatch an operation waiting to retry now (as :meth:`AsyncToolQueue.retry_now`)."""
        return self._apply(self.app.retry_now(self._view(ref, by), by))

    @server_errors
    def verify_now(self, ref: str, *, by: str = "operator:verify") -> State:
        """Check an operation in verifying now (as :meth:`AsyncToolQueue.verify_now`)."""
        return self._apply(self.app.verify_now(self._view(ref, by), by))

    @server_errors
    def resolve(
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
        """Settle an escalated operation (as :meth:`AsyncToolQueue.resolve`)."""
        how = operator.Settle.parse(outcome)
        r = operator.Resolution(by=by, reason=reason, rev=str(rev), reference=reference)
        return self._apply(self.app.resolution(self._view(ref, by), how, r, result))

    @server_errors
    def list_operations(self, state: str | None, **filters: Any) -> OperationPage:
        """One page of the operations in ``state`` (as :meth:`AsyncToolQueue.list_operations`)."""
        q = self.app.list_query(state, **filters)
        # Every cell's page, merged (the single tag: one cell, its page as it is).
        return lists.read_page_cells(self.redis, q, self.app.topology.layout.every_cell())

    def _require(self, ref: object) -> None:
        operations.require_existing(ref, self.app.settings.limits)

    def _view(self, ref: str, by: str) -> operator.View:
        operator.check_actor(by)
        self._require(ref)
        return operator.View.from_fields(ref, self.ledger.fields(ref, *operator.FIELDS))

    def _apply(self, t: Transition) -> State:
        # Traced: the action's span is a child of the submitter's context (one more read).
        stored = self.ledger.fields(t.ref, tracing.FIELD) if tracing.enabled() else {}
        with logs.about(t.ref), tracing.operator(t, stored.get(tracing.FIELD, "")) as span:
            at = self.app.now_ms()
            answer = self.ledger.apply_one(t, at)
            span.recorded(t, answer, at)
        return operations.applied(t, answer)
