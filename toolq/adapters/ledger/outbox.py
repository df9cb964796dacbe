"""Reads of the ledger's outbox stream (outbox mode, :mod:`toolq.services.relay`): how
many messages wait in it, when the oldest was added, and what the relays say.

Stream ids are ``<ms>-<seq>`` with the server's clock at ``XADD``: the age of
an entry is read from its id, with no field of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from toolq.core.keys import Keys
from toolq.core.text import as_text


def entry_ms(entry_id: str | bytes) -> int:
    """When the server added a stream entry (ms): the first part of its id."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    try:
        return int(text.split("-", 1)[0])
    except ValueError:
        return 0


def oldest_ms(client: redis.Redis, keys: Keys) -> int | None:
    """When the oldest entry still in the outbox was added (ms); None: it is empty."""
    first: Any = client.xrange(keys.outbox, count=1)
    return entry_ms(first[0][0]) if first else None


def oldest_of(client: redis.Redis, cells: Sequence[Any]) -> int | None:
    """:func:`oldest_ms` over the outboxes of ``cells`` (ledgers: one per cell, or
    the ledger alone without cells), one pipeline; None: all empty."""
    if len(cells) == 1:
        return oldest_ms(client, cells[0].keys)
    pipe = client.pipeline(transaction=False)
    for cell in cells:
        pipe.xrange(cell.keys.outbox, count=1)
    heads = [entry_ms(first[0][0]) for first in pipe.execute() if first]
    return min(heads) if heads else None


def parse_status(
    length: Any, first: Any, beats: dict[Any, Any], now_ms: int, alive_ms: int
) -> dict[str, Any]:
    """The outbox as ``toolq status`` shows it (pure): entries waiting (read by a relay
    or not), the oldest one's age, the relays whose beat is recent, and the largest lag
    they report (how long the entries of their latest batch waited), and what the live
    ones wait for (``waiting``: relay id, what, since when in ms)."""
    live, lags = 0, []
    waiting: list[dict[str, Any]] = []
    for rid, raw in sorted(beats.items()):
        try:
            beat = json.loads(raw)
            at, lag = int(beat["at"]), int(beat["lag_ms"])
        except (ValueError, KeyError, TypeError):
            continue
        if now_ms - at <= alive_ms:
            live += 1
            lags.append(lag)
            wait = beat.get("waiting") if isinstance(beat, dict) else None
            try:
                if isinstance(wait, dict):
                    waiting.append(
                        {"id": as_text(rid), "for": str(wait["for"]), "since": int(wait["since"])}
                    )
            except (KeyError, TypeError, ValueError):
                pass
    oldest = max(0, now_ms - entry_ms(first[0][0])) if first else None
    return {
        "entries": int(length),
        "oldest_age_ms": oldest,
        "relays": live,
        "lag_ms": max(lags) if lags else None,
        "waiting": waiting,
    }
