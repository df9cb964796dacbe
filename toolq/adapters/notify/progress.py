"""Publishing progress: what a tool reports through ``CallContext.progress`` (in the worker)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import redis

from toolq.adapters.notify.format import progress_notice

log = logging.getLogger("toolq.notify")

#: A worker publishes at most one progress notice per operation this often
#: (the last word, fraction 1.0, always goes): 10 a second is smooth for a
#: person and nothing for the server.
PROGRESS_EVERY_S = 0.1
#: After a failed publish a worker stops trying for this long: a tool that
#: reports progress in a tight loop must not wait on a dead server each time.
PROGRESS_PAUSE_S = 5.0


class ProgressPublisher:
    """Publishes what tools report through ``CallContext.progress`` (in the worker).

    Rate-limited per operation (:data:`PROGRESS_EVERY_S`), best effort: a
    failed publish is logged and dropped, never raised into the tool.
    """

    def __init__(
        self,
        client: redis.Redis,
        channel: str | Callable[[str], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        #: The steps channel, or (cells mode) the steps channel of a ref's cell.
        self.channel = channel
        self.clock = clock
        self._paused_until = 0.0

    def reporter(self, ref: str) -> Callable[[float, str | None], None]:
        """The ``progress_cb`` of one attempt of ``ref``."""
        last = -math.inf

        def report(fraction: float, message: str | None) -> None:
            nonlocal last
            now = self.clock()
            if fraction < 1.0 and now - last < PROGRESS_EVERY_S:
                return
            last = now
            self.publish(ref, fraction, message)

        return report

    def publish(self, ref: str, fraction: float, message: str | None) -> bool:
        if self.clock() < self._paused_until:
            return False
        try:
            channel = self.channel if isinstance(self.channel, str) else self.channel(ref)
            # Sharded, as the scripts' notices (toolq.adapters.notify.subscription says why).
            self.client.spublish(channel, progress_notice(ref, fraction, message))
        except (redis.RedisError, OSError):
            self._paused_until = self.clock() + PROGRESS_PAUSE_S
            log.debug("progress of %s not published", ref, exc_info=True)
            return False
        return True
