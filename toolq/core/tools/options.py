"""A tool's options: its recovery policy (:class:`ToolOptions`) and the jitter of its
delayed retries (:class:`Jitter`), each checked when the tool is registered."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from toolq.core.deps import DEP_KEY_PATTERN, is_dep_key


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
    #: The dependency (provider) this tool calls, whose limits and shared backoff hold
    #: its calls back (README "Limits per dependency"): a key (``"stripe"``), or a
    #: function of the validated arguments returning one (``lambda a:
    #: f"stripe:{a.account}"``), evaluated at submit. None: no dependency.
    dependency: str | Callable[[Any], str] | None = None

    @field_validator("dependency")
    @classmethod
    def _dep_key(cls, value: Any) -> Any:
        if isinstance(value, str) and not is_dep_key(value):
            raise ValueError(f"not a dependency key (the pattern is {DEP_KEY_PATTERN})")
        return value

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
