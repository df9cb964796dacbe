"""The worker's consumer: Celery's, holding a few messages beyond its pool's slots,
and reconnecting to its broker every ≤ 2 s, for ever, with one log line per outage.

Reconnecting: Celery's consumer calls kombu's ``ensure_connection`` with kombu's
default intervals (2 s, growing by 2 s to 30 s) and a line per try; after the
ledger's server had been away 60 s a worker took its first call 12 s after the
server answered again. :meth:`Consumer.ensure_connected` caps them at
:data:`toolq.process.waiting.CAP_S` and says the outage once (:class:`toolq.process.waiting.Outage`,
which the worker's heartbeat also carries: ``toolq status`` shows the wait).

With late acknowledgement and a prefetch of one message per slot, a slot that
finishes waits for the worker to fetch its next message: the acknowledgement,
a BRPOP and kombu's bookkeeping of the delivery, one after the other on the
worker's event loop, 2-4 ms under load on a 2-core box, which a 100 ms I/O-bound
tool on a threads pool of 16 paid once per call (0.93 of the pool's ceiling;
bench/RESULTS.md, "(b) I/O-bound"). A small reserve (``worker.reserve``) lets the
next message be in the worker when a slot frees, while at most that many
messages wait behind busy slots instead of in the queue.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

from toolq.adapters.broker.app import RESERVE_KEY
from toolq.process.waiting import CAP_S, FIRST_S, Outage

log = logging.getLogger("toolq.worker")


def reserve_for(setting: int | None, slots: int) -> int:
    """Messages held beyond one prefetch per slot: the setting, or by default one per
    eight slots, none below eight (prefork -c 2: 0; threads -c 16: 2; -c 64: 8). A
    reserved message waits for the first of the busy slots to free: of eight or more,
    soon; of two running long calls, maybe minutes, while another worker is idle."""
    if setting is not None:
        return setting
    return max(slots, 0) // 8


def prefetch_count(slots: int, multiplier: int, reserve: int) -> int:
    """The worker's prefetch: ``multiplier`` per slot plus the reserve (0 stays 0:
    Celery's "no limit", which a pool of no slots asks for)."""
    base = slots * multiplier
    return base + reserve if base else 0


class Consumer(CeleryConsumer):
    """Celery's consumer, with the reserve added wherever it sets the prefetch count.

    (Celery's consumer is partly typed: its attributes are read through ``Any``.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        c: Any = self
        multiplier = max(c.prefetch_multiplier, 1)
        slots = c.initial_prefetch_count // multiplier
        self._toolq_reserve = reserve_for(c.app.conf.get(RESERVE_KEY), slots)
        c.initial_prefetch_count = prefetch_count(slots, multiplier, self._toolq_reserve)
        #: The broker's outage as this worker sees it (read by its heartbeat).
        ledger = c.app.conf.get("toolq_acks_in_ledger")
        self.toolq_broker = Outage(
            "the broker (the ledger's server)" if ledger else "the broker", "broker"
        )

    def ensure_connected(self, conn: Any) -> Any:
        """Celery's, with kombu's retry intervals capped short and one line per outage
        (Celery's errback says every try, with a growing "Trying again in N s")."""
        outage = self.toolq_broker
        ensure = conn.ensure_connection

        def said_once(exc: BaseException, interval: float) -> None:
            _, line = outage.failed(time.time(), type(exc).__name__)
            if line is not None:
                log.warning("%s", line)

        def capped(errback: Any = None, max_retries: Any = None, **options: Any) -> Any:
            options.update(interval_start=FIRST_S, interval_step=FIRST_S, interval_max=CAP_S)
            return ensure(said_once, max_retries, **options)

        conn.ensure_connection = capped
        connected = super().ensure_connected(conn)
        line = outage.answered(time.time())
        if line is not None:
            log.info("%s", line)
        return connected

    def on_connection_error_after_connected(self, exc: Any) -> None:
        """The connection was lost: the outage starts now, said in one line (instead
        of Celery's own, which the reconnect's line per try followed)."""
        _, line = self.toolq_broker.failed(time.time(), type(exc).__name__)
        if line is not None:
            log.warning("%s", line)
        c: Any = self
        if c.pool and c.pool.flush:
            c.pool.flush()

    def _update_prefetch_count(self, index: int = 0) -> Any:
        """After the pool grew or shrank (autoscale, pool_grow/pool_shrink)."""
        c: Any = self
        slots = c.pool.num_processes
        if not c.initial_prefetch_count or not slots:
            return None
        before = self._toolq_reserve
        self._toolq_reserve = reserve_for(c.app.conf.get(RESERVE_KEY), slots)
        c.initial_prefetch_count = prefetch_count(slots, c.prefetch_multiplier, self._toolq_reserve)
        # Celery moves the live prefetch by the slots' share; the reserve's change too
        # (growing to eight slots adds one).
        change = self._toolq_reserve - before
        if change > 0:
            c.qos.increment_eventually(change)
        elif change < 0:
            c.qos.decrement_eventually(-change)
        return c._update_qos_eventually(index)

    @property
    def max_prefetch_count(self) -> int:
        """What Celery restores the prefetch to after a reconnect."""
        c: Any = self
        return prefetch_count(c.pool.num_processes, c.prefetch_multiplier, self._toolq_reserve)
