"""The tool registry: what a tool is, its options, and the context it is called with.

A tool (or verifier) may be ``def`` or ``async def``. :meth:`Tool.invoke` and
:meth:`Tool.lookup` return the result either way: a coroutine is run to its
end on the calling thread's own event loop (:func:`thread_loop`), so a worker
thread or a prefork child awaits async tools without starting a loop per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import logging
import os
import random
import threading
import typing
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic_core import to_jsonable_python

from toolq import errors
from toolq.envelope import FieldError

log = logging.getLogger("toolq.registry")

R = TypeVar("R")


@dataclass(frozen=True)
class Jitter:
    """Jitter added after ``not_before`` (never before it).

    ``full``: uniform in [0, J]; ``equal``: J/2 + uniform in [0, J/2]; ``none``: 0,
    where J = min(max_seconds, ratio x the delay being waited).
    """

    kind: Literal["full", "equal", "none"] = "full"
    ratio: float = 0.1
    max_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.kind not in ("full", "equal", "none"):
            raise ValueError("jitter kind is full, equal or none")
        if self.ratio < 0 or self.max_seconds < 0:
            raise ValueError("jitter ratio and max_seconds are >= 0")

    def bound_ms(self, delay_ms: int) -> int:
        return int(min(self.max_seconds * 1000, self.ratio * max(0, delay_ms)))

    def extra_ms(self, delay_ms: int, rng: random.Random) -> int:
        bound = self.bound_ms(delay_ms)
        if self.kind == "none" or bound <= 0:
            return 0
        if self.kind == "equal":
            half = bound // 2
            return half + rng.randint(0, bound - half)
        return rng.randint(0, bound)


@dataclass(frozen=True)
class CallContext:
    """What a tool (or its verifier) is told about the call it serves.

    ``operation_ref`` is the idempotency key: send it to the provider on every
    attempt; it is the same on every retry and recovery.
    """

    operation_ref: str
    tool: str
    call_id: str | None
    attempt: int
    max_attempts: int
    approved: bool
    args: BaseModel
    deadline: datetime | None = None
    progress_cb: Callable[[float, str | None], None] | None = field(default=None, repr=False)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report progress (0..1, clamped) of a long tool, with a short line.

        In a worker this publishes a progress notice (:mod:`toolq.notify`): it
        reaches ``tq.aio.wait(on_progress=)`` and ``tq.aio.watch`` callers, MCP
        progress notifications and the HTTP event stream. At most about ten a
        second per operation travel (the final 1.0 always does); the message is
        scrubbed of secrets and cut to 200 characters. Never raises for a
        failed publish: progress is best effort, the tool's result is not.
        """
        if self.progress_cb is not None:
            self.progress_cb(max(0.0, min(1.0, fraction)), message)


class ToolOptions(BaseModel):
    """A tool's recovery policy: every option ``@tq.tool(...)`` takes, declared once.

    Each option has a documented default; a bad value or an unknown name is
    refused when the tool is registered (:meth:`parse`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    #: A write changes state somewhere; its unknown outcomes are verified.
    #: ``False`` marks a read: safe to repeat, never verified.
    writes: bool = True
    #: Seconds after an uncertain attempt before "not found" may be believed.
    consistency_window: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    #: Dispatches of one operation, the first included.
    max_attempts: int = Field(default=5, ge=1)
    #: Seconds from submit after which no new attempt is made.
    deadline: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    #: Jitter the scheduler adds to each delayed retry.
    jitter: Jitter = Field(default_factory=Jitter)
    #: The tool must be approved before its first attempt.
    requires_approval: bool = False
    #: Verifier failures tolerated before the operation escalates.
    verify_checks: int = Field(default=5, ge=1)
    #: First delay between verifier re-checks, doubled each time (seconds).
    verify_backoff: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    #: ``safe_details`` keys this tool may add to the allowlist (any iterable of str).
    safe_details: frozenset[str] = frozenset()
    #: Hints for MCP clients.
    idempotent: bool = True
    #: Empty: the first line of the function's docstring, at registration.
    description: str = ""

    @field_validator("safe_details", mode="before")
    @classmethod
    def _key_set(cls, value: Any) -> Any:
        # A lone string is an iterable of str too; taking its letters as keys is never meant.
        if isinstance(value, Iterable) and not isinstance(value, str | bytes):
            return frozenset(value)
        return value

    @field_validator("description", mode="before")
    @classmethod
    def _no_description(cls, value: Any) -> Any:
        return "" if value is None else value

    @classmethod
    def parse(cls, options: Mapping[str, Any], tool: str | None = None) -> ToolOptions:
        """Validated options; one ``ValueError`` naming every bad or unknown option."""
        try:
            return cls.model_validate(dict(options))
        except ValidationError as exc:
            raise ValueError(_options_error(exc, tool)) from None


def _options_error(exc: ValidationError, tool: str | None) -> str:
    problems = []
    for err in exc.errors():
        name = ".".join(str(p) for p in err["loc"]) or "options"
        if err["type"] == "extra_forbidden":
            known = ", ".join(ToolOptions.model_fields)
            problems.append(f"unknown option {name!r} (the options are: {known})")
        else:
            problems.append(f"option {name}={_short(err['input'])}: {err['msg']}")
    who = f"tool {tool}" if tool else "tool options"
    return f"{who}: " + "; ".join(problems)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- async tools

_local = threading.local()
#: Loops a forked child inherited from its parent's thread. Never closed nor
#: collected here: closing one would unregister the parent's descriptors from
#: the epoll instance both processes share.
_inherited: list[asyncio.AbstractEventLoop] = []


class _ThreadLoop:
    """One thread's event loop, closed when the thread's locals go (thread exit) or at exit."""

    __slots__ = ("__weakref__", "closer", "loop", "pid")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.closer = weakref.finalize(self, _close_loop, self.loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    if loop.is_closed() or loop.is_running():
        return
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # a thread that is ending, or another loop running here: close anyway
        log.debug("async generators of a tool loop not shut down", exc_info=True)
    finally:
        loop.close()


def thread_loop() -> asyncio.AbstractEventLoop:
    """The calling thread's event loop for async tools: made on first use, then reused.

    Reused so that clients a tool keeps per loop (an httpx or redis.asyncio
    pool) survive between calls. A forked child makes its own.
    """
    owned: _ThreadLoop | None = getattr(_local, "owned", None)
    if owned is not None and owned.pid != os.getpid():
        owned.closer.detach()
        _inherited.append(owned.loop)
        owned = None
    if owned is None or owned.loop.is_closed():
        owned = _local.owned = _ThreadLoop()
    return owned.loop


def run_sync(value: Any, what: str) -> Any:
    """``value``, or what it resolves to when it is awaitable (an ``async def``'s coroutine)."""
    if not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        if inspect.iscoroutine(value):
            value.close()  # never awaited, on purpose: no warning for it
        raise RuntimeError(
            f"{what} is async and was invoked from a running event loop; await it there instead"
        )
    loop = thread_loop()
    task = asyncio.ensure_future(value, loop=loop)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        # Interrupted from outside (a signal, a soft time limit): let the tool's
        # coroutine unwind now, not inside the next call on this loop.
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):  # the first exception is the one to raise
                loop.run_until_complete(task)
        raise


# --------------------------------------------------------------------------- tools


class Tool(Generic[R]):
    """A registered tool. Calling it calls the function directly (no queue, nothing awaited)."""

    def __init__(
        self, name: str, fn: Callable[..., R], args_model: type[BaseModel], options: ToolOptions
    ) -> None:
        if inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"tool {name}: an async generator cannot be a tool; return the result "
                f"(async def {name}(args, ctx) -> Result)"
            )
        self.name = name
        self.fn = fn
        self.args_model = args_model
        if not options.description:
            doc = (getattr(fn, "__doc__", None) or "").strip()
            options = options.model_copy(update={"description": doc.split("\n")[0]})
        self.options = options
        self.verify_fn: Callable[[CallContext], Any] | None = None
        self._arity = _call_arity(fn, name)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        kind = "write" if self.options.writes else "read"
        return f"<Tool {self.name} ({kind})>"

    @property
    def writes(self) -> bool:
        return self.options.writes

    @property
    def verification_tool(self) -> str | None:
        return None if self.verify_fn is None else getattr(self.verify_fn, "__name__", None)

    def verifier(self, fn: Callable[[CallContext], Any]) -> Callable[[CallContext], Any]:
        """Register the lookup that finds this tool's write by ``ctx.operation_ref``.

        ``def`` or ``async def``, taking the :class:`CallContext`; it returns the
        committed result, or ``None`` when there is none.
        """
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            # Its generator object is never None: every lookup would say "found".
            raise TypeError(f"verifier of {self.name}: a generator cannot be a verifier")
        try:
            inspect.signature(fn).bind(None)
        except TypeError:
            raise TypeError(
                f"verifier of {self.name}: it is called with one argument, the CallContext "
                f"(def find(ctx: CallContext) -> Result | None)"
            ) from None
        except ValueError:  # no signature to read (some builtins): trust it
            pass
        self.verify_fn = fn
        return fn

    def validate(self, args: Any) -> BaseModel:
        """Validate arguments into the tool's model; :class:`errors.InvalidArguments` if not."""
        if isinstance(args, self.args_model):
            return args
        if not isinstance(args, dict):
            raise errors.InvalidArguments(
                "arguments must be a JSON object",
                field_errors=[FieldError(field="args", rule="object")],
            )
        try:
            return self.args_model.model_validate(args)
        except ValidationError as exc:
            raise errors.InvalidArguments(
                f"arguments do not validate for {self.name}",
                field_errors=field_errors_of(exc),
            ) from None

    def invoke(self, model: BaseModel, ctx: CallContext) -> Any:
        """Run the tool for one attempt and return its result (awaited, if it is async)."""
        call_args = (model, ctx)[: self._arity]
        return run_sync(self.fn(*call_args), f"tool {self.name}")

    def lookup(self, ctx: CallContext) -> Any:
        """Run the verifier: the committed result, or ``None`` (awaited, if it is async)."""
        if self.verify_fn is None:
            raise LookupError(f"tool {self.name} has no verifier")
        return run_sync(self.verify_fn(ctx), f"verifier of {self.name}")

    def input_schema(self) -> dict[str, Any]:
        return self.args_model.model_json_schema()


def _call_arity(fn: Callable[..., Any], name: str) -> int:
    """How many of (args, ctx) ``fn`` takes: a tool is ``f()``, ``f(args)`` or ``f(args, ctx)``."""
    try:
        sig = inspect.signature(fn)
    except ValueError:  # no signature to read: the documented form
        return 2
    if not sig.parameters:
        return 0
    for arity in (2, 1) if len(sig.parameters) >= 2 else (1,):
        try:
            sig.bind(*([None] * arity))
        except TypeError:
            continue
        return arity
    raise TypeError(
        f"tool {name}: it is called as {name}(args) or {name}(args, ctx); "
        f"{name}{sig} cannot be called so"
    )


def field_errors_of(exc: ValidationError) -> list[FieldError]:
    out: list[FieldError] = []
    for err in exc.errors()[:20]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "args"
        out.append(FieldError(field=loc[:200], rule=str(err.get("type", "invalid"))[:200]))
    return out


def canonical_json(model: BaseModel) -> str:
    """The canonical JSON of validated arguments: what fingerprints and comparisons use."""
    return json.dumps(
        model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def fingerprint(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


def jsonable(value: Any) -> Any:
    """A tool's result as plain JSON data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return to_jsonable_python(value)


def args_model_for(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """The pydantic model from the first parameter's annotation (or one built from kwargs)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return create_model(f"{name}_args")
    hints = typing.get_type_hints(fn)
    first = hints.get(params[0].name)
    if isinstance(first, type) and issubclass(first, BaseModel):
        return first
    raise TypeError(
        f"tool {name}: the first parameter must be annotated with a pydantic model "
        f"(def {name}(args: MyArgs, ctx: CallContext))"
    )


class Registry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool[Any]] = {}

    def add(self, tool: Tool[Any]) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool[Any]:
        try:
            return self._tools[name]
        except KeyError:
            raise errors.UnknownTool(f"no tool named {name[:80]!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def warn_unverifiable(self) -> list[str]:
        """Names of write tools without a verifier; logged once at worker start-up."""
        names = [t.name for t in self if t.writes and t.verify_fn is None]
        for name in names:
            log.warning(
                "write tool %s has no verifier: its unknown outcomes go straight to escalated",
                name,
            )
        return names
