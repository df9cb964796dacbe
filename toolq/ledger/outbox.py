"""Reads of the ledger's outbox stream (outbox mode, :mod:`toolq.relay`): how
many messages wait in it, when the oldest was added, and what the relays say.

Stream ids are ``<ms>-<seq>`` with the server's clock at ``XADD``: the age of
an entry is read from its id, with no field of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from toolq.keys import OUTBOX_GROUP, Keys


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


@dataclass(frozen=True)
class OutboxStatus:
    """The outbox as ``toolq status`` shows it."""

    entries: int
    pending: int
    oldest_age_ms: int | None
    relays: int
    lag_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "pending": self.pending,
            "oldest_age_ms": self.oldest_age_ms,
            "relays": self.relays,
            "lag_ms": self.lag_ms,
        }


def read_status(client: redis.Redis, keys: Keys, now_ms: int, alive_ms: int) -> OutboxStatus:
    """Entries in the outbox, those read by a relay and not yet acknowledged, the oldest
    entry's age, the relays whose beat is recent, and the largest lag they report."""
    pipe = client.pipeline(transaction=False)
    pipe.xlen(keys.outbox)
    pipe.xrange(keys.outbox, count=1)
    pipe.hgetall(keys.relays)
    length, first, beats = pipe.execute()
    try:
        pending = int(client.xpending(keys.outbox, OUTBOX_GROUP)["pending"])
    except redis.ResponseError:  # no group yet: no relay ever ran
        pending = 0
    oldest = now_ms - entry_ms(first[0][0]) if first else None
    live, lags = 0, []
    for raw in beats.values():
        try:
            beat = json.loads(raw)
            at, lag = int(beat["at"]), int(beat["lag_ms"])
        except (ValueError, KeyError, TypeError):
            continue
        if now_ms - at <= alive_ms:
            live += 1
            lags.append(lag)
    return OutboxStatus(int(length), pending, oldest, live, max(lags) if lags else None)
