"""The :class:`Topology`: the three strategies a deployment runs on (see the package)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolq.core.layout import Layout
from toolq.topology.nodes import Nodes
from toolq.topology.notices import Notices
from toolq.topology.publish import Publish

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis


@dataclass(frozen=True)
class Topology:
    """One deployment's layout, nodes and publishing."""

    layout: Layout
    nodes: Nodes
    publish: Publish

    # ---------------------------------------------------------------- clients

    def make_redis(self, url: str, options: dict[str, Any]) -> redis.Redis:
        """The ledger's sync client (:meth:`Nodes.client`)."""
        return self.nodes.client(url, options)

    def make_async_redis(self, url: str, options: dict[str, Any]) -> aioredis.Redis:
        """A ``redis.asyncio`` client of the ledger (:meth:`Nodes.async_client`)."""
        return self.nodes.async_client(url, options)

    def close_redis(self, client: redis.Redis) -> None:
        self.nodes.close(client)

    @property
    def notices(self) -> Notices:
        """How this deployment hears notices (sync and async subscriptions)."""
        return self.nodes.notices

    @property
    def on_cluster(self) -> bool:
        """The ledger is a Cluster (what error messages and the recorded mode say)."""
        return self.nodes.on_cluster

    # ---------------------------------------------------------------- publishing

    @property
    def publishes_via_outbox(self) -> bool:
        """The ledger's scripts append messages to the outbox (its calls name it)."""
        return self.publish.via_outbox

    @property
    def needs_relay(self) -> bool:
        """Something must publish the outbox: a stack starts relays."""
        return self.publish.needs_relay

    def broker(self, ledger_url: str | None) -> str | None:
        """The Celery broker, given the ledger's URL (None: not known yet)."""
        return self.publish.broker(ledger_url)

    @property
    def safe_broker(self) -> str:
        return self.publish.safe_broker
