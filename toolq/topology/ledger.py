"""The ledger's classes per mode, picked here and nowhere else (the ledger never chooses).

- one server: :class:`~toolq.adapters.ledger.durable.OneServer` (async: ``AsyncOneServer``);
- a Cluster: :class:`~toolq.adapters.ledger.durable.ClusterNodes` (async: ``AsyncClusterNodes``);
- inline publish: :class:`~toolq.adapters.ledger.wire.InlinePush`;
- outbox: :class:`~toolq.adapters.ledger.wire.OutboxPush`.

The layout (:mod:`toolq.core.layout`) is the topology's own and passed as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from toolq.adapters.ledger import durable
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.adapters.ledger.cluster import InFlight
from toolq.adapters.ledger.store import Ledger
from toolq.adapters.ledger.wire import InlinePush, OutboxPush, Push
from toolq.topology import nodes, publish
from toolq.topology.model import Topology

#: Where a Celery message goes, by the topology's publishing (a new mode: a row).
PUSH: dict[type[publish.Publish], type[Push]] = {
    publish.Inline: InlinePush,
    publish.Outbox: OutboxPush,
}
#: How the ledger reaches its server, by the topology's nodes: (sync, async).
NODES: dict[
    type[nodes.Nodes], tuple[Callable[[Any], durable.Nodes], Callable[[Any], durable.AsyncNodes]]
] = {
    nodes.OneServer: (durable.OneServer, durable.AsyncOneServer),
    nodes.ClusterNodes: (durable.ClusterNodes, durable.AsyncClusterNodes),
}


def ledger_for(topology: Topology, client: redis.Redis, durability: str) -> Ledger:
    """The sync ledger of a deployment: its layout, its push and its nodes."""
    return Ledger(
        client,
        topology.layout.prefix,
        durability,
        layout=topology.layout,
        push=PUSH[type(topology.publish)](),
        nodes=NODES[type(topology.nodes)][0](client),
    )


def async_ledger_for(
    topology: Topology,
    client: aioredis.Redis,
    durability: str,
    in_flight: InFlight | None = None,
    batch: int = 0,
) -> AsyncLedger:
    """The same on ``redis.asyncio`` (``tq.aio``); ``in_flight``: see
    :class:`toolq.adapters.ledger.cluster.InFlight`; ``batch``: see
    :class:`toolq.adapters.ledger.aio.AsyncLedger`."""
    return AsyncLedger(
        client,
        topology.layout.prefix,
        durability,
        in_flight=in_flight,
        layout=topology.layout,
        push=PUSH[type(topology.publish)](),
        nodes=NODES[type(topology.nodes)][1](client),
        batch=batch,
    )
