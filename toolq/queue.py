"""``ToolQueue``: the Python API agents and runtimes use.

tq = ToolQueue(redis_url="redis://127.0.0.1:6379/0")

@tq.tool(writes=True, consistency_window=2.0, max_attempts=5)
def create_invoice(args: CreateInvoice, ctx: CallContext) -> Invoice: ...

ref = tq.submit("create_invoice", {...}, operation_ref="run_81/step_4").operation_ref
env = tq.wait(ref, timeout=30.0)
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import redis
from celery import Celery

from toolq import errors
from toolq import fixed as envelopes
from toolq.app import App
from toolq.envelope import FieldError, ToolError, ToolSuccess
from toolq.ledger import Ledger
from toolq.record import OperationRecord, load_envelope
from toolq.recovery import operator
from toolq.recovery.transition import Transition
from toolq.settings import REF_PUNCTUATION, ToolqSettings
from toolq.states import SETTLED, State
from toolq.tasks.run import Runtime
from toolq.tools import Tool, ToolOptions, args_model_for, canonical_json, fingerprint

R = TypeVar("R")


@dataclass(frozen=True)
class Submission:
    operation_ref: str
    state: State
    created: bool


class ToolQueue:
    """The client facade: register tools, submit calls, wait, act as an operator.

    Holds an :class:`~toolq.app.App` (``tq.app``): the settings, registry and
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

    def __repr__(self) -> str:
        a = self.app
        url = a.settings.safe_url if a.settings.redis_url else "(no url yet)"
        return f"<ToolQueue {a.name} {url} tools={len(a.registry)}>"

    # ------------------------------------------------------------------ the app's parts

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

        ``options`` are :class:`~toolq.tools.ToolOptions` fields (defaults: a write,
        5 attempts, 1 h deadline, 2 s window); an unknown or bad one raises
        ``ValueError`` here, at registration.
        """
        opts = ToolOptions.parse(options, name)

        def register(f: Callable[..., R]) -> Tool[R]:
            tool_name = name or f.__name__
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", tool_name):
                raise ValueError(f"tool name {tool_name!r} is not an identifier")
            t: Tool[R] = Tool(tool_name, f, args_model_for(f, tool_name), opts)
            self.registry.add(t)
            return t

        return register(fn) if fn is not None else register

    # ------------------------------------------------------------------ submit

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
        t = self.registry.get(tool)
        model = t.validate(args)
        canonical = self._canonical(model)
        ref = self._ref(operation_ref, run_id, step)
        longest = self.app.settings.limits.max_ref_length
        if call_id is not None and (not isinstance(call_id, str) or len(call_id) > longest):
            raise errors.InvalidArguments(
                f"call_id must be a string of at most {longest} characters"
            )
        app = self.app
        now_ms = app.now_ms()
        state = State.AWAITING_APPROVAL if t.options.requires_approval else State.QUEUED
        queue, message = app.messages.run(ref, 1) if state is State.QUEUED else ("", "")
        policy = app.policy
        due = now_ms + (
            policy.unclaimed_after_ms if state is State.QUEUED else policy.approval_timeout_ms
        )
        res = app.ledger.submit(
            ref=ref,
            tool=t.name,
            args_json=canonical,
            fp=fingerprint(canonical),
            call_id=call_id or "",
            now_ms=now_ms,
            max_attempts=t.options.max_attempts,
            deadline_ms=now_ms + int(t.options.deadline * 1000),
            state=state,
            due_ms=due,
            queue=queue,
            message=message,
        )
        if res.outcome == "conflict":
            raise errors.IdempotencyKeyReused(
                "this operation_ref was already used with other arguments",
                envelope=envelopes.fixed_envelope("IDEMPOTENCY_KEY_REUSED", ref, t.name, call_id),
                operation_ref=ref,
            )
        return Submission(ref, res.state, res.outcome == "created")

    def _canonical(self, model: Any) -> str:
        try:
            canonical = canonical_json(model)
        except (TypeError, ValueError):
            raise errors.InvalidArguments("arguments are not JSON-serialisable") from None
        cap = self.app.settings.limits.max_args_bytes
        if len(canonical.encode()) > cap:
            raise errors.InvalidArguments(
                f"arguments are larger than the {cap}-byte limit", limit=cap
            )
        return canonical

    def _ref(self, operation_ref: str | None, run_id: str | None, step: str | int | None) -> str:
        if operation_ref is None and run_id is not None and step is not None:
            operation_ref = f"{run_id}/{step}"
        if operation_ref is None:
            return f"op_{uuid.uuid4().hex}"
        limits = self.app.settings.limits
        if not isinstance(operation_ref, str) or not limits.ref_re.fullmatch(operation_ref):
            raise errors.InvalidArguments(
                f"operation_ref must be 1-{limits.max_ref_length} characters of letters, "
                f"digits and {REF_PUNCTUATION}",
                field_errors=[FieldError(field="operation_ref", rule="pattern")],
            )
        return operation_ref

    # ------------------------------------------------------------------ read

    def get(self, ref: str) -> OperationRecord | None:
        """The operation's record (state, attempt, envelope, history), or None."""
        return self.ledger.get(ref)

    def wait(self, ref: str, timeout: float = 30.0) -> ToolSuccess | ToolError:
        """Block until the operation needs nothing more from the runtime.

        On timeout, the current envelope if it has one (``OUTCOME_UNKNOWN`` while
        verifying, ``RATE_LIMITED`` while waiting to retry); ``TimeoutError`` if none.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        notifier = self.app.notifier
        ev = notifier.watch(ref)
        try:
            while True:
                f = self.ledger.fields(ref, "state", "envelope", "tool", "call_id", "rev")
                if not f:
                    raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
                state = State(f["state"])
                env = load_envelope(f["envelope"]) if f.get("envelope") else None
                if state in SETTLED:
                    if env is None:  # approval required before the first attempt
                        env = envelopes.needs_approval_envelope(ref, f["tool"], f.get("call_id"))
                    return _settled(state, env)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if env is not None and not env.ok:
                        return env
                    raise TimeoutError(f"operation {ref[:80]} is still {state}")
                ev.wait(remaining)
                ev.clear()
                n = ev.notice
                # A notice newer than what was read carries the outcome: no second read.
                newer = n is not None and n.envelope and n.rev > int(f.get("rev") or 0)
                if n is not None and newer and State(n.state) in SETTLED:
                    return _settled(State(n.state), load_envelope(n.envelope))
        finally:
            notifier.unwatch(ref, ev)

    # ------------------------------------------------------------------ operator actions

    def approve(self, ref: str, *, by: str = "operator:approve") -> State:
        """Approve an operation awaiting approval, bound to its current arguments."""
        app = self.app
        return self._apply(
            operator.approve(self._view(ref), app.now_ms(), app.policy, app.outbound, by)
        )

    def provide_input(self, ref: str, args: Any, *, by: str = "operator:input") -> State:
        """Replace the arguments of an operation that needs input; identical ones are refused."""
        app = self.app
        v = self._view(ref)
        v.require(State.NEEDS_INPUT)
        canonical = self._canonical(self.registry.get(v.tool).validate(args))
        t = operator.provide_input(
            v, canonical, fingerprint(canonical), app.now_ms(), app.policy, app.outbound, by
        )
        return self._apply(t)

    def cancel(self, ref: str, *, by: str = "operator:cancel") -> State:
        """Cancel an operation that has not started a write (queued or waiting on someone)."""
        t = operator.cancel(self._view(ref), self.app.policy, by)
        return State.CANCELLED if t is None else self._apply(t)

    def _view(self, ref: str) -> operator.View:
        return operator.View.from_fields(ref, self.ledger.fields(ref, *operator.FIELDS))

    def _apply(self, t: Transition) -> State:
        res = self.ledger.apply_one(t, self.app.now_ms())
        if res != "ok":
            raise errors.InvalidState(
                f"operation changed meanwhile (now {res}); read it again", state=res
            )
        return t.to


def _settled(state: State, env: ToolSuccess | ToolError) -> ToolSuccess | ToolError:
    if env.ok and state is not State.SUCCEEDED:  # pragma: no cover - invariant 8
        raise AssertionError("a success envelope on an unsettled write")
    return env
