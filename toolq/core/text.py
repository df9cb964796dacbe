"""A Redis reply's value as text (pure): what every reader of a hash or stream field needs."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> str:
    """``value`` (bytes as a client without ``decode_responses`` answers, or anything else)
    as a str."""
    return value.decode() if isinstance(value, bytes) else str(value)
