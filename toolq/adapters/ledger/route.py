"""Where a Cluster call goes, attempt after attempt: what a node's answer says (pure).

A call and its waits (:mod:`toolq.adapters.ledger.durability`) are pipelined on one
connection of the primary that serves the call's slot; an answer that says the
call did not run there (MOVED, ASK, a lost connection, NOSCRIPT: :func:`resend`)
refreshes the client's map (or loads the scripts) and sends it all again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from toolq.adapters.ledger.durability import Plan
from toolq.adapters.ledger.runner import lost_scripts

#: How many times a Cluster call is sent before its error is raised: once, then
#: after a MOVED, ASK, failover or NOSCRIPT (redis-py's cluster client tries 3 too).
ROUTE_ATTEMPTS = 3


@dataclass(frozen=True)
class Resend:
    """What a Cluster node's answer asks before the call is sent again (:func:`resend`)."""

    #: The client's map of the cluster is stale (a slot moved, a failover): read it again.
    remap: bool = False
    #: The slot is being imported by this node (host, port): ask it, with ASKING first.
    ask: tuple[str, int] | None = None
    #: The node lost the scripts (a restart without persistence): load them again.
    load: bool = False
    #: Seconds to wait first (the slot is busy being moved).
    pause: float = 0.0


def resend(reply: object) -> Resend | None:
    """Whether a call's answer says it did not run, and where to send it again; None
    when it ran (or failed for good). Pure. A lost connection may or may not have run
    it: every ledger call is a compare-and-set, so sending it again is safe (redis-py's
    cluster client sends it again too)."""
    if isinstance(reply, (redis.exceptions.MovedError, redis.exceptions.ReadOnlyError)):
        return Resend(remap=True)  # MovedError first: it is an AskError too
    if isinstance(reply, redis.exceptions.AskError):
        return Resend(ask=(reply.host, reply.port))
    if isinstance(reply, redis.exceptions.TryAgainError):
        return Resend(pause=0.05)
    if isinstance(reply, redis.exceptions.ClusterDownError):
        return Resend(remap=True, pause=0.25)
    if isinstance(reply, redis.exceptions.MaxConnectionsError):
        return None  # the client's pool is full, the node is fine: raised as is
    if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
        return Resend(remap=True)
    if lost_scripts(reply):
        return Resend(load=True)
    return None


def _shard(cluster: Any, slot: int) -> list[Any]:
    """The nodes serving ``slot`` in the client's map: its primary, then its replicas
    (CLUSTER SLOTS leaves out a replica the cluster marked failed)."""
    shard: list[Any] = cluster.nodes_manager.slots_cache.get(slot) or []
    if not shard:
        raise redis.exceptions.SlotNotCoveredError(f"slot {slot} is not covered by the cluster")
    return shard


class Route:
    """Where a Cluster call goes, attempt after attempt: the bookkeeping of
    :func:`toolq.adapters.ledger.durable.cluster_call`, the core the sync and async shells share.

    Per attempt: :meth:`shard` (the slot's nodes, for the plan), :meth:`commands` to
    pipeline on :attr:`node`, :meth:`replies` of them, then :meth:`after`: None when
    the call ran (or failed for good, or this was the last attempt), else what to do
    before sending it again (:class:`Resend`, with ``remap`` also when the node an
    ASK named is not in the map).
    """

    def __init__(self, cluster: Any, slot: int) -> None:
        self.cluster = cluster
        self.slot = slot
        self.ask: Any = None
        self.node: Any = None

    def shard(self) -> list[Any]:
        shard = _shard(self.cluster, self.slot)
        self.node = self.ask or shard[0]
        return shard

    def commands(self, call: Sequence[Any], plan: Plan) -> list[tuple[Any, ...]]:
        asking = [("ASKING",)] if self.ask is not None else []
        return [*asking, tuple(call), *plan.waits()]

    def replies(self, answers: Sequence[Any]) -> list[Any]:
        """The call's answer, then the waits' (ASKING's own answer left out)."""
        return list(answers[1 if self.ask is not None else 0 :])

    def after(self, reply: object, last: bool) -> Resend | None:
        again = resend(reply)
        if again is None or last:
            return None
        self.ask = None
        if again.ask is not None:
            self.ask = self.cluster.nodes_manager.get_node(*again.ask)
            if self.ask is None:
                again = replace(again, remap=True)
        return again
