"""The ledger on a Valkey/Redis Cluster: a RedisCluster that routes FCALL itself.

redis-py routes ``EVAL``/``EVALSHA`` by the keys the call declares, but any other
command whose keys it cannot find in a table, ``FCALL`` among them, by asking the
cluster's *default node* ``COMMAND GETKEYS`` with the whole call (arguments
included) before sending it. For the ledger that is one more round trip and one
more command per script call, all of them on one node, and, worse, outside the
client's retry loop: with the default node dead (a primary SIGKILLed, before its
replica took over and the client refreshed its map) every FCALL fails with a
connection error, whichever node its cell is on (tests/integration/cluster).

:class:`LedgerCluster` routes ``FCALL`` and ``FCALL_RO`` as redis-py routes
``EVALSHA``: by the slot of the keys in the call, which the ledger always
declares (:mod:`toolq.ledger.scripts`: every key a script touches is in KEYS,
all under one cell's tag).
"""

from __future__ import annotations

from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

_FUNCTION_CALLS = frozenset({"FCALL", "FCALL_RO"})


class LedgerCluster(RedisCluster):
    """``RedisCluster`` that routes a function call by its declared keys (see above)."""

    def determine_slot(self, *args: Any) -> int | None:
        if len(args) > 3 and str(args[0]).upper() in _FUNCTION_CALLS:
            keys = args[3 : 3 + int(args[2])]
            slots: set[int] = {self.keyslot(key) for key in keys}  # type: ignore[no-untyped-call]
            if len(slots) > 1:
                raise RedisClusterException(f"{args[0]} - all keys must map to the same key slot")
            if slots:
                return slots.pop()
        slot: int | None = super().determine_slot(*args)
        return slot
