"""The ledger's side of acknowledging a Celery delivery (the Celery side:
:mod:`toolq.adapters.broker.ack`).

Where the ledger's server is the broker too, the ledger call that ends a
delivery (a refused claim, the record of its outcome) acknowledges it in the
same script: the script removes the delivery tag from kombu's unacked hash and
index (:data:`UNACKED_KEYS`), as kombu's ack would (:mod:`toolq.adapters.ledger.scripts`).
:func:`with_ack` adds the tag and the keys to a call; :func:`ack` is the same
for a delivery that ends without a ledger call.
"""

from __future__ import annotations

from typing import Any

import redis

from toolq.core.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX

#: The keys a call that acknowledges a Celery delivery also writes (kombu's, untagged:
#: only on the server that is the broker too, as the Celery queue lists SUBMIT pushes to).
UNACKED_KEYS = (KOMBU_UNACKED, KOMBU_UNACKED_INDEX)


def with_ack(keys: list[Any], args: list[Any], delivery: str | None) -> None:
    """A script call's KEYS and its last argument when it acknowledges ``delivery``
    (none: the call acknowledges nothing)."""
    if delivery:
        args.append(delivery)
        keys.extend(UNACKED_KEYS)


def ack(client: redis.Redis, delivery: str) -> None:
    """Acknowledge a Celery delivery without a ledger call: what kombu's Redis
    transport sends on ack, in one transaction."""
    pipe = client.pipeline(transaction=True)
    pipe.hdel(KOMBU_UNACKED, delivery)
    pipe.zrem(KOMBU_UNACKED_INDEX, delivery)
    pipe.execute()
