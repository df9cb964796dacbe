"""The sans-I/O core of a notice subscription: which channel is subscribed on which
node, which wait to be subscribed again, when to try, and what a message means.

The four subscriptions (:mod:`toolq.adapters.notify.subscription` sync,
:mod:`toolq.adapters.notify.aio_subscription` async; each on one server or sharded over a
Cluster) hold one :class:`Placement` and do only the I/O around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from toolq.adapters.notify.format import text_of

#: After a channel could not be subscribed (its node down, its slot moving), the
#: next try waits this long: a failover takes a second or two, a migration less.
PLACE_RETRY_S = 0.2

#: Sharded Pub/Sub's kinds of message, as the classic ones the subscribers read.
_CLASSIC_KIND = {"smessage": "message", "ssubscribe": "subscribe", "sunsubscribe": "unsubscribe"}


def as_classic(msg: dict[str, Any]) -> dict[str, Any]:
    """A sharded message under its classic kind (other messages as they are)."""
    kind = _CLASSIC_KIND.get(msg.get("type"))  # type: ignore[arg-type]
    return msg if kind is None else {**msg, "type": kind}


def owners(cluster: Any, channels: Sequence[str]) -> dict[str, list[str]]:
    """The channels by the name of the node serving each one's slot (the client's map)."""
    found: dict[str, list[str]] = {}
    for channel in channels:
        found.setdefault(cluster.get_node_from_key(channel).name, []).append(channel)
    return found


class Placement:
    """Where each channel is subscribed: node name ("" on one server) by channel, and
    the homeless ones (never placed, or whose node was lost or gave their slot away)."""

    def __init__(self, channels: Sequence[str] = ()) -> None:
        self.channels: list[str] = []
        self.where: dict[str, str] = {}
        #: Channels subscribed nowhere now, and when to try them again.
        self.homeless: list[str] = []
        self.retry_at = 0.0
        #: Whether the client's map of the cluster must be read again before placing.
        self.stale = False
        self.add(*channels)

    def add(self, *channels: str) -> list[str]:
        """Take these channels too (homeless until placed); the new ones."""
        new = [c for c in dict.fromkeys(channels) if c not in self.channels]
        self.channels += new
        self.homeless += new
        return new

    def due(self, now: float) -> bool:
        """Whether some channels wait to be placed and may be tried now."""
        return bool(self.homeless) and now >= self.retry_at

    def capped(self, timeout: float, now: float) -> float:
        """How long a read may wait: no longer than until homeless channels are tried."""
        if not self.homeless:
            return timeout
        return min(timeout, max(0.0, self.retry_at - now))

    def idle(self, timeout: float, now: float) -> float:
        """How long to sleep with no connection to read (a later call places them)."""
        wait = timeout if not self.homeless else self.retry_at - now
        return max(0.0, min(timeout, wait))

    def placed(self, node: str, channels: Sequence[str]) -> None:
        for channel in channels:
            self.where[channel] = node
        done = set(channels)
        self.homeless = [c for c in self.homeless if c not in done]

    def unplace(self, node: str) -> None:
        """Forget that the channels subscribed on ``node`` are; they are homeless again."""
        gone = [c for c, n in self.where.items() if n == node]
        for channel in gone:
            del self.where[channel]
        self.homeless += [c for c in gone if c not in self.homeless]

    def lost(self, now: float) -> None:
        """A node's connection failed (its channels unplaced): try again soon, with the
        map read again."""
        self.stale = True
        self.retry_at = now + PLACE_RETRY_S

    def by_owner(self, cluster: Any) -> dict[str, list[str]]:
        """The homeless channels by owner, as the map ``cluster`` just read says."""
        self.stale = False
        return owners(cluster, self.homeless)

    def unmapped(self, exc: BaseException, now: float) -> redis.ConnectionError:
        """The map of the cluster could not be read: the error to raise (tried later)."""
        self.stale = True
        self.retry_at = now + PLACE_RETRY_S
        return redis.ConnectionError(f"notices: no map of the cluster ({exc})")

    def moved(self, sub: Any, msg: dict[str, Any]) -> dict[str, Any]:
        """``msg`` as the subscribers read it (:func:`as_classic`). A ``sunsubscribe``
        says the channel's slot left its node (we never unsubscribe): the channel is
        homeless, to be subscribed on its new owner, and ``sub`` forgets it (else a
        reconnect asks for it again)."""
        if msg.get("type") == "sunsubscribe":
            channel = text_of(msg["channel"])
            sub.shard_channels.pop(msg["channel"], None)
            if self.where.pop(channel, None) is not None:
                self.homeless.append(channel)
                self.stale = True
        return as_classic(msg)

    def deserted(self, node: str) -> bool:
        """Whether none of the channels is subscribed on ``node`` any more."""
        return node not in self.where.values()
