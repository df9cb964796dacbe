"""The ledger's classes per mode, picked here and nowhere else (the ledger never chooses).

- one server: :class:`~toolq.ledger.durable.OneServer` (async: ``AsyncOneServer``);
- a Cluster: :class:`~toolq.ledger.durable.ClusterNodes` (async: ``AsyncClusterNodes``);
- inline publish: :class:`~toolq.ledger.wire.InlinePush`;
- outbox: :class:`~toolq.ledger.wire.OutboxPush`.

The layout (:mod:`toolq.layout`) is the topology's own and passed as it is.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

from toolq.layout import Layout
from toolq.ledger import durable
from toolq.ledger.aio import AsyncLedger
from toolq.ledger.cluster import InFlight
from toolq.ledger.store import Ledger
from toolq.ledger.wire import InlinePush, OutboxPush, Push

#: Where a Celery message goes, by ``via_outbox``.
_PUSH: dict[bool, type[Push]] = {False: InlinePush, True: OutboxPush}
#: How a client reaches the server, by ``on_cluster``: (sync, async).
_NODES: dict[bool, tuple[Any, Any]] = {
    False: (durable.OneServer, durable.AsyncOneServer),
    True: (durable.ClusterNodes, durable.AsyncClusterNodes),
}


def ledger_for(
    client: redis.Redis,
    durability: str,
    layout: Layout,
    *,
    on_cluster: bool,
    via_outbox: bool,
) -> Ledger:
    """The sync ledger of a deployment: its layout, its push and its nodes."""
    nodes: durable.Nodes = _NODES[on_cluster][0](client)
    return Ledger(
        client,
        layout.prefix,
        durability,
        layout=layout,
        push=_PUSH[via_outbox](),
        nodes=nodes,
    )


def async_ledger_for(
    client: aioredis.Redis,
    durability: str,
    layout: Layout,
    *,
    on_cluster: bool,
    via_outbox: bool,
    in_flight: InFlight | None = None,
) -> AsyncLedger:
    """The same on ``redis.asyncio`` (``tq.aio``); ``in_flight``: see
    :class:`toolq.ledger.cluster.InFlight`."""
    nodes: durable.AsyncNodes = _NODES[on_cluster][1](client)
    return AsyncLedger(
        client,
        layout.prefix,
        durability,
        in_flight=in_flight,
        layout=layout,
        push=_PUSH[via_outbox](),
        nodes=nodes,
    )
