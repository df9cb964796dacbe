"""The tool registry: what a tool is, its options, and the context it is called with."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import random
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError, create_model
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
        """Report progress (0..1) of a long tool; reaches MCP clients as notifications."""
        if self.progress_cb is not None:
            self.progress_cb(max(0.0, min(1.0, fraction)), message)


@dataclass(frozen=True)
class ToolOptions:
    """A tool's recovery policy. Every option has a documented default."""

    #: A write changes state somewhere; its unknown outcomes are verified.
    #: ``False`` marks a read: safe to repeat, never verified.
    writes: bool = True
    #: Seconds after an uncertain attempt before "not found" may be believed.
    consistency_window: float = 2.0
    #: Dispatches of one operation, the first included.
    max_attempts: int = 5
    #: Seconds from submit after which no new attempt is made.
    deadline: float = 3600.0
    #: Jitter the scheduler adds to each delayed retry.
    jitter: Jitter = field(default_factory=Jitter)
    #: The tool must be approved before its first attempt.
    requires_approval: bool = False
    #: Verifier failures tolerated before the operation escalates.
    verify_checks: int = 5
    #: First delay between verifier re-checks, doubled each time (seconds).
    verify_backoff: float = 1.0
    #: ``safe_details`` keys this tool may add to the allowlist.
    safe_details: frozenset[str] = frozenset()
    #: Hints for MCP clients.
    idempotent: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.consistency_window < 0 or self.deadline <= 0 or self.verify_checks < 1:
            raise ValueError("consistency_window >= 0, deadline > 0, verify_checks >= 1")


class Tool(Generic[R]):
    """A registered tool. Calling it calls the function directly (no queue)."""

    def __init__(
        self, name: str, fn: Callable[..., R], args_model: type[BaseModel], options: ToolOptions
    ) -> None:
        self.name = name
        self.fn = fn
        self.args_model = args_model
        self.options = options
        self.verify_fn: Callable[[CallContext], Any] | None = None
        self._takes_ctx = len(inspect.signature(fn).parameters) >= 2

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

        It returns the committed result, or ``None`` when there is none.
        """
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
        if self._takes_ctx:
            return self.fn(model, ctx)
        return self.fn(model)

    def input_schema(self) -> dict[str, Any]:
        return self.args_model.model_json_schema()


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
