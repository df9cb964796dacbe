"""What a service's loop runs on: the parts of an :class:`toolq.client.app.App` it asks for.

The relay takes :class:`Parts` as it is; the scheduler asks for more (its tools and
recovery policy: :class:`toolq.services.scheduler.service.Parts`). A test hands either
loop a small fake with these attributes instead of an App.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import redis

from toolq.adapters.ledger import Ledger
from toolq.core.settings import ToolqSettings
from toolq.topology import Topology


class Parts(Protocol):
    """The settings, the clock, the Redis client and its URL, the ledger, the topology."""

    settings: ToolqSettings
    clock: Callable[[], float]

    @property
    def redis(self) -> redis.Redis: ...

    @property
    def redis_url(self) -> str: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def topology(self) -> Topology: ...
