"""A tool, the context it is called with, and the registry of a process's tools."""

from __future__ import annotations

import inspect
import logging
import typing
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, PydanticUserError, ValidationError, create_model
from pydantic.json_schema import PydanticJsonSchemaWarning

from toolq.core import errors
from toolq.core.deps import Limits
from toolq.core.envelope import FieldError
from toolq.core.tools.data import field_errors_of
from toolq.core.tools.loop import run_sync
from toolq.core.tools.options import ToolOptions

log = logging.getLogger("toolq.registry")

R = TypeVar("R")


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

        In a worker this publishes a progress notice (:mod:`toolq.adapters.notify`): it
        reaches ``tq.aio.wait(on_progress=)`` and ``tq.aio.watch`` callers, MCP
        progress notifications and the HTTP event stream. At most about ten a
        second per operation travel (the final 1.0 always does); the message is
        scrubbed of secrets and cut to 200 characters. Never raises for a
        failed publish: progress is best effort, the tool's result is not.
        """
        if self.progress_cb is not None:
            self.progress_cb(max(0.0, min(1.0, fraction)), message)


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
        try:  # what MCP's tools/list and every framework adapter show: one bad one failed all
            with warnings.catch_warnings():  # said where the schema is shown, not at import
                warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
                args_model.model_json_schema()
        except PydanticUserError as exc:  # a field JSON cannot carry (a Callable, ...)
            raise TypeError(
                f"tool {name}: its arguments ({args_model.__name__}) have no JSON Schema: "
                f"{str(exc).splitlines()[0][:160]}; arguments arrive as JSON"
            ) from None
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

    @property
    def is_async(self) -> bool:
        """Whether the tool is ``async def``: an event loop awaits it (the asyncio pool).

        Asked once per function, not at every call (``inspect`` unwraps and reads
        flags: thousands of calls at once asked it on the pool's loop)."""
        fn = self.fn
        known = self.__dict__.get("_is_async_of")
        if known is None or known[0] is not fn:
            known = self.__dict__["_is_async_of"] = (fn, _is_coroutine_fn(fn))
        return bool(known[1])

    @property
    def verifier_is_async(self) -> bool:
        return self.verify_fn is not None and _is_coroutine_fn(self.verify_fn)

    def ainvoke(self, model: BaseModel, ctx: CallContext) -> Any:
        """An ``async def`` tool's coroutine for one attempt, to await on a running loop
        (:attr:`is_async`; a sync tool goes through :meth:`invoke` on a thread)."""
        return self.fn(*(model, ctx)[: self._arity])

    def alookup(self, ctx: CallContext) -> Any:
        """An ``async def`` verifier's coroutine (:attr:`verifier_is_async`)."""
        if self.verify_fn is None:
            raise LookupError(f"tool {self.name} has no verifier")
        return self.verify_fn(ctx)

    def input_schema(self) -> dict[str, Any]:
        return object_schema(self.args_model.model_json_schema())


def object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its object at the top. pydantic answers a recursive model (a
    ``Node`` with ``children: list[Node]``) with ``{"$ref": "#/$defs/Node", "$defs":
    ...}``, which MCP refuses as a tool's ``inputSchema`` (its type must be ``object``)
    and forms cannot walk: the definition it names is put at the top, the ``$defs``
    kept beside it for the references inside."""
    ref = schema.get("$ref")
    defs = schema.get("$defs")
    prefix = "#/$defs/"
    if not (isinstance(ref, str) and ref.startswith(prefix) and isinstance(defs, dict)):
        return schema
    target = defs.get(ref[len(prefix) :])
    if not isinstance(target, dict):
        return schema
    rest = {k: v for k, v in schema.items() if k != "$ref"}
    return {**target, **rest}


def _is_coroutine_fn(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object whose __call__ is async)
    )


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


def args_model_for(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """The pydantic model from the first parameter's annotation (or one built from kwargs)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return create_model(f"{name}_args")
    try:
        hints = typing.get_type_hints(fn)
    except TypeError:  # a callable object, a functools.partial: its signature's annotations
        signed = inspect.signature(fn, eval_str=True).parameters.values()
        hints = {p.name: p.annotation for p in signed}
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
        #: Limits per dependency key declared in code (``tq.limit``); the settings'
        #: override them field by field (:func:`toolq.core.deps.merged`).
        self.limits: dict[str, Limits] = {}

    def add(self, tool: Tool[Any]) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool[Any]:
        try:
            return self._tools[name]
        except (KeyError, TypeError):  # TypeError: not even hashable, so not a name
            raise errors.UnknownTool(f"no tool named {str(name)[:80]!r}") from None

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
