"""What the scheduler knows of each queue's backlog when it decides on queued and
verifying operations (:class:`toolq.decisions.recovery.policy.Queues`): one class per publish
mode, picked once (:func:`ages_for`).

Inline (the ledger is the broker): the heads of the queue lists, dated by their
records (:class:`ListHeads`). Outbox: the broker's queue heads cannot be read; what is
known instead is how many messages each queue holds and what the outbox still holds
(:class:`OutboxAges`, :func:`toolq.decisions.recovery.policy.on_its_way`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Protocol

import redis

from toolq.adapters.broker.app import transport_options
from toolq.adapters.broker.depth import Depths
from toolq.adapters.broker.messages import message_head
from toolq.adapters.ledger import Ledger, outbox
from toolq.adapters.ledger.replies import number
from toolq.core.settings import ToolqSettings
from toolq.decisions.recovery.policy import Queues, Waiting, oldest_waiting
from toolq.topology.model import Topology
from toolq.topology.publish import Inline, Outbox, Publish

#: Messages read at the front of each queue to tell how old its backlog is: past the
#: redeliveries kombu puts there, to the first message it can date.
QUEUE_HEAD = 8


class Parts(Protocol):
    settings: ToolqSettings

    @property
    def redis(self) -> redis.Redis: ...

    @property
    def ledger(self) -> Ledger: ...


class DepthReader(Protocol):
    """Each queue's depth on the broker (:class:`toolq.adapters.broker.depth.Depths`)."""

    def read(self, names: Iterable[str]) -> dict[str, int | None]: ...

    def close(self) -> None: ...


class QueueAges(ABC):
    """Reads :class:`Queues` for a batch, only when a queued or verifying operation is
    due in it (two round trips)."""

    def __init__(self, app: Parts) -> None:
        self.app = app

    def __call__(self, rows: list[dict[str, str]]) -> Queues:
        if not any(r.get("state") in ("queued", "verifying") for r in rows):
            return Queues()
        return self.read()

    @abstractmethod
    def read(self) -> Queues: ...

    def close(self) -> None:  # noqa: B027  (nothing held)
        pass


class ListHeads(QueueAges):
    """Inline: what the head of each queue list says of its backlog
    (:func:`oldest_waiting`)."""

    def read(self) -> Queues:
        q = self.app.settings.queues
        client, ledger = self.app.redis, self.app.ledger
        heads = client.pipeline(transaction=False)
        heads.lrange(q.calls, -QUEUE_HEAD, -1)
        heads.lrange(q.verify, -QUEUE_HEAD, -1)
        # kombu pushes on the left and takes from the right: the front is the list's end
        calls, verify = ([message_head(m) for m in reversed(raw)] for raw in heads.execute())
        refs = list(dict.fromkeys(h[0] for h in calls + verify if h[0]))
        pipe = client.pipeline(transaction=False)
        for ref in refs:
            pipe.hmget(ledger.keys_of(ref).op(ref), ["attempt", "vcheck", "repubs", "published"])
        records = dict(zip(refs, pipe.execute(), strict=True))

        def waiting(head: list[tuple[str | None, int, bool]], verify: bool) -> list[Waiting]:
            out = []
            for ref, seq, redelivered in head:
                attempt, vcheck, repubs, published = records.get(ref or "", [None] * 4)
                mine = vcheck if verify else attempt
                out.append(
                    Waiting(
                        ref=ref,
                        seq=seq,
                        redelivered=redelivered,
                        record_seq=None if mine is None else number(mine),
                        republished=not verify and number(repubs) > 0,
                        published_ms=number(published),
                    )
                )
            return out

        oldest_call, waiting_calls = oldest_waiting(waiting(calls, verify=False))
        oldest_verify, waiting_verify = oldest_waiting(waiting(verify, verify=True))
        return Queues(oldest_call, oldest_verify, waiting_calls, waiting_verify)


class OutboxAges(QueueAges):
    """Outbox: the broker's queue depths (read on a connection of its own) and the
    oldest entry the outboxes still hold."""

    def __init__(self, app: Parts, depths: DepthReader) -> None:
        super().__init__(app)
        self.depths = depths

    def read(self) -> Queues:
        q = self.app.settings.queues
        oldest = outbox.oldest_of(self.app.redis, self.app.ledger.every_cell())
        depths = self.depths.read((q.calls, q.verify))
        return Queues(
            opaque=True,
            calls_depth=depths[q.calls],
            verify_depth=depths[q.verify],
            oldest_outbox_ms=oldest,
        )

    def close(self) -> None:
        self.depths.close()


def _broker_depths(settings: ToolqSettings, url: str) -> Depths:
    return Depths(url, transport_options=transport_options(settings, url))


def ages_for(topology: Topology, app: Parts) -> QueueAges:
    """How a scheduler on this topology reads the queues' backlog."""
    publish = topology.publish
    build: dict[type[Publish], Callable[[], QueueAges]] = {
        Inline: lambda: ListHeads(app),
        Outbox: lambda: OutboxAges(app, _broker_depths(app.settings, str(publish.broker(None)))),
    }
    return build[type(publish)]()
