"""``ToolQueue``: the Python API agents and runtimes use.

tq = ToolQueue(redis_url="redis://127.0.0.1:6379/0")

@tq.tool(writes=True, consistency_window=2.0, max_attempts=5)
def create_invoice(args: CreateInvoice, ctx: CallContext) -> Invoice: ...

ref = tq.submit("create_invoice", {...}, operation_ref="run_81/step_4").operation_ref
env = tq.wait(ref, timeout=30.0)
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import redis
from celery import Celery
from pydantic import SecretStr

from toolq import errors
from toolq.envelope import (
    ToolError,
    ToolSuccess,
)
from toolq.ledger import Ledger, OperationRecord, State, Transition
from toolq.ledger.record import load_envelope
from toolq.ledger.states import SETTLED
from toolq.notify import Notifier
from toolq.redact import redact_url
from toolq.scheduler.policy import Jitter, attempts_remaining
from toolq.settings import ToolqSettings
from toolq.state import discover_redis_url
from toolq.tasks import envelopes, outcome
from toolq.tasks.registry import (
    Registry,
    Tool,
    ToolOptions,
    args_model_for,
    canonical_json,
    fingerprint,
)
from toolq.tasks.run import Runtime
from toolq.workers.app import make_celery
from toolq.workers.messages import RUN_TASK, VERIFY_TASK, MessageFactory

R = TypeVar("R")
_REF_RE = re.compile(r"[A-Za-z0-9_.:/@#+=-]{1,200}")


@dataclass(frozen=True)
class Submission:
    operation_ref: str
    state: State
    created: bool


class ToolQueue:
    """Tools, the ledger and the Celery app of one toolq deployment."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: ToolqSettings | None = None,
        name: str = "toolq",
        clock: Callable[[], float] = time.time,
    ) -> None:
        settings = settings or ToolqSettings()
        if redis_url is not None:
            settings = settings.model_copy(update={"redis_url": SecretStr(redis_url)})
            ToolqSettings.model_validate(settings.model_dump())  # same checks as the env path
        self.settings = settings
        self.name = name
        self.clock = clock
        self.registry = Registry()
        self._lock = threading.RLock()
        self._redis: redis.Redis | None = None
        self._ledger: Ledger | None = None
        self._celery: Celery | None = None
        self._messages: MessageFactory | None = None
        self._runtime: Runtime | None = None
        self._notifier: Notifier | None = None

    def __repr__(self) -> str:
        url = self.settings.safe_url if self.settings.redis_url else "(no url yet)"
        return f"<ToolQueue {self.name} {url} tools={len(self.registry)}>"

    # ------------------------------------------------------------------ wiring

    @property
    def redis_url(self) -> str:
        if self.settings.redis_url is None:
            found = discover_redis_url()
            if found is None:
                raise errors.RequestRefused(
                    "no Redis URL: pass redis_url=, set TOOLQ_REDIS_URL, or run `toolq up` "
                    "in this directory"
                )
            self.settings = self.settings.model_copy(update={"redis_url": SecretStr(found)})
        return self.settings.url

    @property
    def redis(self) -> redis.Redis:
        with self._lock:
            if self._redis is None:
                # A blocking pool: past max_connections a caller waits for a free
                # connection instead of failing with "Too many connections".
                pool = redis.BlockingConnectionPool.from_url(
                    self.redis_url,
                    max_connections=self.settings.limits.max_connections,
                    timeout=20,
                    socket_connect_timeout=5,
                    socket_keepalive=True,
                    health_check_interval=30,
                )
                self._redis = redis.Redis(connection_pool=pool)
            return self._redis

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(self.redis, self.settings.prefix)
        return self._ledger

    @property
    def celery(self) -> Celery:
        """The Celery app: ``celery -A module:celery_app worker`` serves every toolq queue."""
        with self._lock:
            if self._celery is None:
                self._celery = self._make_celery()
            return self._celery

    @property
    def messages(self) -> MessageFactory:
        if self._messages is None:
            q = self.settings.queues
            self._messages = MessageFactory(self.celery, q.calls, q.verify)
        return self._messages

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            m = self.messages
            self._runtime = Runtime(
                self.registry,
                self.ledger,
                outcome.Messages(run=m.run, verify=m.verify),
                self.policy,
                int(self.settings.lease.seconds * 1000),
                self.clock,
            )
        return self._runtime

    @property
    def policy(self) -> outcome.Policy:
        r = self.settings.recovery
        return outcome.Policy(
            unclaimed_after_ms=int(r.unclaimed_after * 1000),
            approval_timeout_ms=int(r.approval_timeout * 1000),
            input_timeout_ms=int(r.input_timeout * 1000),
            retention_s=r.retention,
        )

    def configure(self, *, redis_url: str) -> None:
        """Point this ToolQueue (and its Celery app) at another server, before use."""
        self.settings = self.settings.model_copy(update={"redis_url": SecretStr(redis_url)})
        ToolqSettings.model_validate(self.settings.model_dump())
        with self._lock:
            if self._notifier is not None:
                self._notifier.close()
                self._notifier = None
            if self._redis is not None:
                self._redis.close()
            self._redis = None
            self._ledger = None
            self._runtime = None
            if self._celery is not None:
                self._celery.conf.update(broker_url=redis_url)

    def _make_celery(self) -> Celery:
        url: str | None
        try:
            url = self.redis_url
        except errors.RequestRefused:
            url = None  # set later by configure(), before any worker starts
        app = make_celery(self.settings, self.name, url)
        app.toolq = self  # type: ignore[attr-defined]
        tq = self

        @app.task(name=RUN_TASK, ignore_result=True)
        def run(ref: str, attempt: int) -> str:
            return tq.runtime.run_attempt(ref, int(attempt))

        @app.task(name=VERIFY_TASK, ignore_result=True)
        def verify(ref: str, attempt: int, vcheck: int) -> str:
            return tq.runtime.run_check(ref, int(attempt), int(vcheck))

        return app

    def close(self) -> None:
        if self._notifier is not None:
            self._notifier.close()
            self._notifier = None
        if self._runtime is not None:
            self._runtime.leases.stop()
        if self._redis is not None:
            self._redis.close()
            self._redis = None
            self._ledger = None

    # ------------------------------------------------------------------ tools

    @overload
    def tool(self, fn: Callable[..., R], /) -> Tool[R]: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        writes: bool = True,
        consistency_window: float = 2.0,
        max_attempts: int = 5,
        deadline: float = 3600.0,
        jitter: Jitter | None = None,
        requires_approval: bool = False,
        verify_checks: int = 5,
        verify_backoff: float = 1.0,
        safe_details: tuple[str, ...] = (),
        idempotent: bool = True,
        description: str | None = None,
    ) -> Callable[[Callable[..., R]], Tool[R]]: ...

    def tool(
        self,
        fn: Callable[..., R] | None = None,
        /,
        *,
        name: str | None = None,
        writes: bool = True,
        consistency_window: float = 2.0,
        max_attempts: int = 5,
        deadline: float = 3600.0,
        jitter: Jitter | None = None,
        requires_approval: bool = False,
        verify_checks: int = 5,
        verify_backoff: float = 1.0,
        safe_details: tuple[str, ...] = (),
        idempotent: bool = True,
        description: str | None = None,
    ) -> Tool[R] | Callable[[Callable[..., R]], Tool[R]]:
        """Register a tool. Defaults: a write, 5 attempts, 1 h deadline, 2 s window."""

        def register(f: Callable[..., R]) -> Tool[R]:
            tool_name = name or f.__name__
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", tool_name):
                raise ValueError(f"tool name {tool_name!r} is not an identifier")
            opts = ToolOptions(
                writes=writes,
                consistency_window=consistency_window,
                max_attempts=max_attempts,
                deadline=deadline,
                jitter=jitter or Jitter(),
                requires_approval=requires_approval,
                verify_checks=verify_checks,
                verify_backoff=verify_backoff,
                safe_details=frozenset(safe_details),
                idempotent=idempotent,
                description=description or (f.__doc__ or "").strip().split("\n")[0],
            )
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
        if call_id is not None and (not isinstance(call_id, str) or len(call_id) > 200):
            raise errors.InvalidArguments("call_id must be a string of at most 200 characters")
        now_ms = int(self.clock() * 1000)
        state = State.AWAITING_APPROVAL if t.options.requires_approval else State.QUEUED
        queue, message = self.messages.run(ref, 1) if state is State.QUEUED else ("", "")
        due = now_ms + (
            self.policy.unclaimed_after_ms
            if state is State.QUEUED
            else self.policy.approval_timeout_ms
        )
        res = self.ledger.submit(
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
        cap = self.settings.limits.max_args_bytes
        if len(canonical.encode()) > cap:
            raise errors.InvalidArguments(
                f"arguments are larger than the {cap}-byte limit", limit=cap
            )
        return canonical

    @staticmethod
    def _ref(operation_ref: str | None, run_id: str | None, step: str | int | None) -> str:
        if operation_ref is None and run_id is not None and step is not None:
            operation_ref = f"{run_id}/{step}"
        if operation_ref is None:
            return f"op_{uuid.uuid4().hex}"
        if not isinstance(operation_ref, str) or not _REF_RE.fullmatch(operation_ref):
            raise errors.InvalidArguments(
                "operation_ref must be 1-200 characters of letters, digits and _.:/@#+=-"
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
        notifier = self._get_notifier()
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

    def _get_notifier(self) -> Notifier:
        with self._lock:
            if self._notifier is None:
                self._notifier = Notifier(self.redis, self.ledger.keys.notify)
            return self._notifier

    # ------------------------------------------------------------------ operator actions

    def approve(self, ref: str) -> State:
        """Approve an operation awaiting approval, bound to its current arguments."""
        f = self._fields_in(ref, State.AWAITING_APPROVAL)
        return self._requeue(
            ref,
            f,
            by="operator:approve",
            code="APPROVED",
            extra={"approved_fp": f["fp"]},
            expect_field="fp",
        )

    def provide_input(self, ref: str, args: Any) -> State:
        """Replace the arguments of an operation that needs input; identical ones are refused."""
        f = self._fields_in(ref, State.NEEDS_INPUT)
        tool = self.registry.get(f["tool"])
        canonical = self._canonical(tool.validate(args))
        fp = fingerprint(canonical)
        if fp == f.get("blocked_fp") or fp == f.get("fp"):
            raise errors.InvalidArguments(
                "the arguments are identical to the ones that needed fixing",
                code_hint="ARGUMENTS_UNCHANGED",
            )
        return self._requeue(
            ref,
            f,
            by="operator:input",
            code="INPUT_PROVIDED",
            extra={"args": canonical, "fp": fp},
            expect_field="blocked_fp",
        )

    def cancel(self, ref: str) -> State:
        """Cancel an operation that has not started a write (queued or waiting on someone)."""
        f = self._fields(ref)
        state = State(f["state"])
        if state is State.CANCELLED:
            return state
        cancellable = (
            State.QUEUED,
            State.WAITING_RETRY,
            State.NEEDS_INPUT,
            State.AWAITING_APPROVAL,
        )
        if state not in cancellable:
            raise errors.InvalidState(
                f"operation is {state}; only queued or waiting operations can be cancelled",
                state=str(state),
            )
        env = envelopes.cancelled_envelope(ref, f["tool"], f.get("call_id"))
        t = Transition(
            ref=ref,
            states=(state,),
            to=State.CANCELLED,
            by="operator:cancel",
            code="CANCELLED",
            expect={"*": {"rev": f["rev"]}},
            envelope=env,
            remove_due=True,
            ttl=self.settings.recovery.retention,
            stats=("cancelled",),
        )
        return self._apply(t)

    def _fields(self, ref: str) -> dict[str, str]:
        f = self.ledger.fields(
            ref,
            "state",
            "tool",
            "call_id",
            "fp",
            "blocked_fp",
            "attempt",
            "max_attempts",
            "rev",
            "deadline",
        )
        if "state" not in f:
            raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
        return f

    def _fields_in(self, ref: str, state: State) -> dict[str, str]:
        f = self._fields(ref)
        if f["state"] != state:
            raise errors.InvalidState(f"operation is {f['state']}, not {state}", state=f["state"])
        return f

    def _requeue(
        self,
        ref: str,
        f: dict[str, str],
        *,
        by: str,
        code: str,
        extra: dict[str, str],
        expect_field: str,
    ) -> State:
        state = State(f["state"])
        attempt = int(f.get("attempt") or 0)
        now_ms = int(self.clock() * 1000)
        expect = {"*": {"rev": f["rev"], expect_field: f.get(expect_field, "")}}
        if attempts_remaining(attempt, int(f.get("max_attempts") or 0)) == 0:
            env = envelopes.escalation_envelope(
                "ATTEMPTS_EXHAUSTED", ref, f["tool"], f.get("call_id")
            )
            t = Transition(
                ref=ref,
                states=(state,),
                to=State.ESCALATED,
                by=by,
                code="ATTEMPTS_EXHAUSTED",
                expect=expect,
                envelope=env,
                remove_due=True,
                ttl=self.settings.recovery.retention,
                stats=("escalated",),
            )
        else:
            t = Transition(
                ref=ref,
                states=(state,),
                to=State.QUEUED,
                by=by,
                code=code,
                expect=expect,
                attempt_incr=1,
                set={**extra, "repubs": "0"},
                push=self.messages.run(ref, attempt + 1),
                due_ms=now_ms + self.policy.unclaimed_after_ms,
            )
        return self._apply(t)

    def _apply(self, t: Transition) -> State:
        res = self.ledger.apply_one(t, int(self.clock() * 1000))
        if res != "ok":
            raise errors.InvalidState(
                f"operation changed meanwhile (now {res}); read it again", state=res
            )
        return t.to

    # ------------------------------------------------------------------ info

    def describe(self) -> dict[str, Any]:
        return {
            "redis_url": redact_url(self.redis_url),
            "tools": [
                {"name": t.name, "writes": t.writes, "verifier": t.verification_tool}
                for t in self.registry
            ],
        }


def _settled(state: State, env: ToolSuccess | ToolError) -> ToolSuccess | ToolError:
    if env.ok and state is not State.SUCCEEDED:  # pragma: no cover - invariant 8
        raise AssertionError("a success envelope on an unsettled write")
    return env
