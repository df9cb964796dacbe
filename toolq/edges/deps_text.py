"""Dependency keys in words, as ``toolq deps``, ``toolq status`` and the console say them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolq.core.deps import Limits

#: How the breaker's states read.
BREAKER_WORDS = {"closed": "closed", "open": "OPEN", "half_open": "half-open"}


def limit_text(limits: Limits | Mapping[str, Any]) -> str:
    """``20/s burst 5, 5 at once`` (``-`` for a key without a rate or a concurrency)."""
    lim = limits if isinstance(limits, Limits) else Limits.model_validate(limits)
    parts = []
    if lim.rate:
        parts.append(lim.rate + (f" burst {lim.burst}" if lim.burst else ""))
    if lim.concurrency:
        parts.append(f"{lim.concurrency} at once")
    return ", ".join(parts) or "-"


def seconds_text(ms: int) -> str:
    """A duration: ``850ms``, ``12s``, ``4m05s``, ``2h10m``."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def paused_text(paused_until_ms: int | None, now_ms: int, code: str | None = None) -> str:
    """``paused 12s (RATE_LIMITED)`` or ``-``."""
    if paused_until_ms is None:
        return "-"
    return f"paused {seconds_text(paused_until_ms - now_ms)}" + (f" ({code})" if code else "")


def status_line(dep: Mapping[str, Any], now_ms: int) -> str:
    """One line of ``toolq status`` about a key that needs a look."""
    parts = [f"{dep['key']}:"]
    if dep.get("paused_until_ms") is not None:
        parts.append(paused_text(dep["paused_until_ms"], now_ms, dep.get("pause_code")))
    if dep.get("breaker", "closed") != "closed":
        parts.append(f"breaker {BREAKER_WORDS.get(dep['breaker'], dep['breaker'])}")
    parts.append(f"{dep.get('waiting', 0)} waiting, {dep.get('in_flight', 0)} in flight")
    return " ".join(parts)
