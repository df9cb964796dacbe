"""How a deployment hears notices: the subscription classes of its mode.

One server: one connection, one ``SSUBSCRIBE`` of every channel
(:class:`~toolq.adapters.notify.Subscription`). A Cluster: one connection per primary
owning some of the channels, each channel subscribed there by itself
(:class:`~toolq.adapters.notify.ShardedSubscription`). The notifiers and the services'
listeners take the class they are given and never ask which mode it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolq.adapters.notify import (
    AsyncNotifier,
    AsyncShardedSubscription,
    AsyncSubscription,
    Notifier,
    ShardedSubscription,
    Subscription,
)


@dataclass(frozen=True)
class Notices:
    """One mode's notice subscriptions, sync and ``redis.asyncio``."""

    subscription: type[Subscription]
    async_subscription: type[AsyncSubscription]

    def subscribe(self, client: Any, channels: Sequence[str]) -> Subscription:
        """A subscription to ``channels`` (the scheduler's and the relay's wake-ups)."""
        return self.subscription(client, channels)

    def notifier(self, client: Any, channels: Sequence[str]) -> Notifier:
        """The sync client's notifier, settled states on ``channels``."""
        return Notifier(client, *channels, subscription=self.subscription)

    def async_notifier(
        self, client: Any, channels: Sequence[str], steps_channels: Sequence[str]
    ) -> AsyncNotifier:
        """One event loop's notifier (``tq.aio``)."""
        return AsyncNotifier(client, channels, steps_channels, subscription=self.async_subscription)


ONE_SERVER = Notices(Subscription, AsyncSubscription)
CLUSTER = Notices(ShardedSubscription, AsyncShardedSubscription)
