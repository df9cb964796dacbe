"""Deliveries acknowledged by the ledger: the Celery side, in one place.

When the broker is the ledger's server (the Celery setting :data:`SETTING`,
set by :func:`toolq.adapters.broker.app.celery_config`), the ledger call that ends a
delivery (a refused claim, the record of its outcome) acknowledges it in the
same script (:mod:`toolq.adapters.ledger.ack`, the ledger's side: the keys and the tag).
Here, in the order a delivery meets them:

1. :func:`delivery_of`: the tag a task body hands to that ledger call;
2. :func:`ended_in_ledger`: whether the body's end went through such a call
   (:class:`toolq.adapters.broker.request.Request`, in a prefork worker's parent);
3. :func:`acked_by_ledger` marks the tag then, and :func:`take` is what
   :class:`toolq.adapters.broker.transport.QoS` asks before Celery's own ack: a marked tag
   gets only the local bookkeeping, no round trip. Measured in bench/RESULTS.md.
"""

from __future__ import annotations

import threading
from typing import Any

#: The Celery setting: the ledger's server is the broker, its calls acknowledge.
SETTING = "toolq_acks_in_ledger"

_acked: set[str] = set()
_acked_lock = threading.Lock()


def in_ledger(conf: Any) -> bool:
    """Whether the ledger acknowledges this Celery app's deliveries."""
    return bool(conf.get(SETTING))


def delivery_of(task: Any) -> str | None:
    """The delivery tag a task body passes to the ledger call that ends it (None:
    the ledger does not acknowledge, Celery's ack goes to the broker as usual)."""
    if not in_ledger(task.app.conf):
        return None
    tag = (task.request.delivery_info or {}).get("delivery_tag")
    return str(tag) if tag else None


def ended_in_ledger(started: bool, unsettled: bool, conf: Any) -> bool:
    """A body that started and then returned, or raised only after the ledger recorded
    its outcome, ended through a ledger call that acknowledged; one that never started
    (revoked, expired), failed otherwise, or timed out may not have."""
    return started and not unsettled and in_ledger(conf)


def acked_by_ledger(delivery_tag: str) -> None:
    """The ledger acknowledged this delivery: Celery's coming ack sends nothing."""
    with _acked_lock:
        _acked.add(delivery_tag)


def take(delivery_tag: str) -> bool:
    """Whether the ledger acknowledged this delivery (forgotten here once asked)."""
    with _acked_lock:
        if delivery_tag in _acked:
            _acked.discard(delivery_tag)
            return True
        return False
