"""Limits per dependency (issue 28): what a tool declares about the provider it calls,
and the stored shape of a dependency's limiter. Pure: no Redis, no Celery.

A tool names the dependency it calls, ``@tq.tool(dependency="stripe")`` or a function
of its arguments (``dependency=lambda a: f"stripe:{a.account}"``); the key is computed
once, at submit, stored on the record (field ``dep``) and carried to every attempt.
Each key may have :class:`Limits` (declared in code, overridden by settings): a rate
(token bucket with a burst), a concurrency (calls in flight across every worker), and
a circuit breaker. Their state lives in the ledger, beside the operations it limits:

``Keys.dep(key)`` (hash), fields:

- ``tat``: the rate limiter's theoretical arrival time (GCRA, ms): the bucket is full
  when ``tat <= now``; each call moves it one interval on.
- ``paused_until`` (ms) and ``pause_code``: the shared backoff. A ``RateLimited`` or
  ``Unavailable`` outcome of one call pauses the whole key until its ``not_before``.
- ``breaker``: ``closed`` | ``open`` | ``half_open``; ``fails`` and ``fails_since`` (ms):
  failures counted in the current window; ``open_until`` (ms); ``probe`` and
  ``probe_until``: the one call testing a half-open key, and its lease.
- ``rate``, ``burst``, ``concurrency``, ``breaker_failures``, ``breaker_window_ms``,
  ``breaker_open_ms``: the limits the last claim used (what the console shows).
- counters: ``n_admitted``, ``n_limited``, ``n_paused``, ``n_opened``.

``Keys.dep_slots(key)`` (sorted set): the refs holding a concurrency slot, scored by
their lease's end (ms); an expired slot (its worker died) is dropped on the next
acquire. ``Keys.dep_waiting(key)`` (sorted set): the refs the key holds back (limited:
``waiting_retry`` with ``DEPENDENCY_LIMITED``), scored by their ``not_before`` (ms); a
released slot, or an operator lifting a pause, makes the first of them due now.
``Keys.deps`` (sorted set): every key, scored by its last use (ms).

On one tag these are the ledger's own keys. With cells, a key's limiter lives in the
one cell :func:`dep_cell` picks from the key (not the operation's): no global key,
and a hot dependency is one cell's load.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: A dependency key: what a tool's ``dependency=`` gives (or returns). Short, printable,
#: and safe in a Redis key name and a URL path segment.
DEP_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@+\-]{0,127}$"
_DEP_KEY_RE = re.compile(DEP_KEY_PATTERN)

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*(ms|s|m|h)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}

BreakerState = Literal["closed", "open", "half_open"]


def is_dep_key(value: object) -> bool:
    """Whether ``value`` is an acceptable dependency key (:data:`DEP_KEY_PATTERN`)."""
    return isinstance(value, str) and _DEP_KEY_RE.fullmatch(value) is not None


@dataclass(frozen=True)
class Rate:
    """``count`` calls per ``per_ms`` milliseconds (``"100/s"``, ``"20/10s"``, ``"600/m"``)."""

    count: float
    per_ms: int

    @classmethod
    def parse(cls, text: str) -> Rate:
        m = _RATE_RE.fullmatch(text)
        if m is None:
            raise ValueError(
                f"a rate is <count>/<unit> with unit ms, s, m or h, optionally with a "
                f"multiple (100/s, 20/10s, 600/m), got {text!r}"
            )
        count, mult, unit = float(m.group(1)), int(m.group(2) or 1), m.group(3)
        if count <= 0 or mult <= 0:
            raise ValueError(f"a rate's count and period are > 0, got {text!r}")
        return cls(count=count, per_ms=mult * _UNIT_MS[unit])

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two calls at this rate (the GCRA emission interval)."""
        return self.per_ms / self.count


class Limits(BaseModel):
    """One dependency key's limits; every one optional (none: no limit, but the shared
    backoff and the breaker still apply to a key that is declared)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Calls per period across every worker: ``"100/s"``, ``"20/10s"``, ``"600/m"``.
    rate: str | None = None
    #: Calls the bucket lets through at once after a quiet spell; default: 1.
    burst: int | None = Field(default=None, ge=1)
    #: Calls in flight at most, across every worker and host.
    concurrency: int | None = Field(default=None, ge=1)
    #: Failures (``Unavailable``, timeouts) within ``breaker_window`` that open the breaker.
    breaker_failures: int = Field(default=5, ge=1)
    #: Seconds over which failures are counted.
    breaker_window: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: Seconds an open breaker stays open before one probe call tests the key.
    breaker_open: float = Field(default=30.0, gt=0, allow_inf_nan=False)

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None:
            Rate.parse(value)
        return value

    @property
    def parsed_rate(self) -> Rate | None:
        return None if self.rate is None else Rate.parse(self.rate)


class DepView(BaseModel):
    """What the console, the API, ``toolq status`` and the metrics show of one key."""

    model_config = ConfigDict(frozen=True)

    key: str
    limits: Limits
    in_flight: int = 0
    waiting: int = 0
    #: The shared backoff's end (ms since the epoch), None when not paused.
    paused_until_ms: int | None = None
    pause_code: str | None = None
    breaker: BreakerState = "closed"
    open_until_ms: int | None = None
    probe: str | None = None
    admitted: int = 0
    limited: int = 0
    last_used_ms: int | None = None


def dep_cell(key: str, cells: int) -> int:
    """The cell whose keys hold ``key``'s limiter (cells mode): a hash of the key,
    :func:`toolq.core.cells.cell_of`'s (spelled here: the settings import this module,
    and the cells sit above them; a unit test holds the two equal)."""
    if isinstance(cells, bool) or not isinstance(cells, int) or cells < 1:
        raise ValueError(f"the number of cells must be a whole number >= 1: {cells!r}")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % cells


#: The defaults of a key no one declared limits for: the shared backoff and the breaker.
DEFAULT_LIMITS = Limits()


def merged(code: Limits | None, settings: Limits | None) -> Limits:
    """A key's limits: those declared in code, overridden field by field by those the
    settings set (``TOOLQ_DEPENDENCIES``: only the fields the settings name)."""
    if settings is None:
        return code or DEFAULT_LIMITS
    if code is None:
        return settings
    return code.model_copy(update={f: getattr(settings, f) for f in settings.model_fields_set})


def limits_for(key: str, declared: dict[str, Limits]) -> tuple[str | None, Limits]:
    """The limits a key uses, and the name they were declared under: the key itself,
    else the part before its first ``:`` (``stripe:acct_1`` uses ``stripe``'s, with a
    limiter of its own); none declared: (None, the defaults)."""
    if key in declared:
        return key, declared[key]
    head = key.split(":", 1)[0]
    if head in declared:
        return head, declared[head]
    return None, DEFAULT_LIMITS


def limits_table(declared: dict[str, Limits], share: int = 1) -> str:
    """Every declared key's limits as the claim script reads them (one JSON object:
    name -> [rate, interval_ms, burst, concurrency, breaker_failures, breaker_window_ms,
    breaker_open_ms]); "" when none is declared (the script then uses the defaults).

    ``share``: the number of cells (cells mode), each of which limits a key's calls in
    it on its own: each gets that share of the rate, the burst and the concurrency
    (:func:`limits_row`), so that together they stay within the limits."""
    if not declared:
        return ""
    table = {name: limits_row(lim, share) for name, lim in sorted(declared.items())}
    return json.dumps(table, separators=(",", ":"))


def limits_row(lim: Limits, share: int = 1) -> list[str | int | float]:
    """One key's limits as the scripts read them (:func:`limits_table`), for one of
    ``share`` cells: the rate divided by ``share``, the burst and the concurrency too
    (at least 1 each: a concurrency below the number of cells lets one call per cell)."""
    rate = lim.parsed_rate
    share = max(1, share)
    conc = lim.concurrency or 0
    return [
        lim.rate or "",
        0 if rate is None else rate.interval_ms * share,
        max(1, (lim.burst or 1) // share),
        max(1, conc // share) if conc else 0,
        lim.breaker_failures,
        int(lim.breaker_window * 1000),
        int(lim.breaker_open * 1000),
    ]


def declared(code: dict[str, Limits], settings: dict[str, Limits]) -> dict[str, Limits]:
    """Every declared key's limits: code's (``tq.limit``) and the settings', merged."""
    return {k: merged(code.get(k), settings.get(k)) for k in sorted({*code, *settings})}
