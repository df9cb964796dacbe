"""Each event loop's connections for ``tq.aio`` (:mod:`toolq.client.aio`).

Connections belong to the event loop they were made on: each running loop gets its
own :class:`Bound` (a pool, the ledger on it, the notice subscription), made on first
use and closed by ``aclose`` or when the loop shuts down and cancels its tasks (as
``asyncio.run``, ``anyio.run`` and servers do). :class:`Loops` keeps one per loop, so
several loops in several threads can share one ``tq.aio``. :class:`Turns` keeps a loop
fair to the rest of the program: at most :data:`CALLS_PER_PASS` calls begin in one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable

from toolq.client.app import App
from toolq.process import heap
from toolq.topology.ledger import async_ledger_for

#: Connections per event loop (on a Cluster, per node): one for the notice
#: subscription, the others for commands (past them a command waits for a free
#: one). Every command toolq sends is short, so a few dozen carry thousands of
#: waiting calls; each one more costs a handshake, and every connection's reply
#: can resume a task in the same pass of the loop.
CONNECTIONS_PER_LOOP = 32

#: Calls that begin in one pass of the event loop (the rest: the next passes).
#: 1,000 calls started by one gather spent 89 ms of CPU in the loop's first pass,
#: 220 ms of wall time on 2 busy CPUs, with nothing else on the loop running
#: (each validates, builds its message and sends; bench/aio_bench.py). The loop's
#: thread then ran at most, between two ticks of a 5 ms ticker (with as many
#: notices dispatched per pass): 26-27 ms at 32 per pass, 12-22 ms at 16, 10-21 ms
#: at 8, 7-13 ms at 4 (6 waves each, the same throughput; bench/RESULTS.md).
CALLS_PER_PASS = 4

#: On a Cluster: connections of each node that commands in turns (every command of
#: the loop's client: AsyncLedgerCluster.in_flight) leave free, for what redis-py
#: sends outside a turn (a map refresh); the notice subscription has its own.
CLUSTER_SPARE_CONNECTIONS = 4


class Turns:
    """At most ``per_pass`` callers go on in one pass of the event loop; the others
    wait for the next passes, in the order they came."""

    def __init__(self, per_pass: int) -> None:
        self.per_pass = per_pass
        self._left = per_pass
        self._queue: deque[asyncio.Future[None]] = deque()
        self._pass_ends = False

    async def take(self) -> None:
        if self._left > 0 and not self._queue:
            self._left -= 1
            self._end_pass_soon()
            return
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        self._end_pass_soon()
        await turn

    def _end_pass_soon(self) -> None:
        # call_soon runs at the next pass of the loop: that is where a pass ends.
        if not self._pass_ends:
            self._pass_ends = True
            asyncio.get_running_loop().call_soon(self._next_pass)

    def _next_pass(self) -> None:
        self._pass_ends = False
        self._left = self.per_pass
        while self._left > 0 and self._queue:
            turn = self._queue.popleft()
            if not turn.done():  # else its caller was cancelled while it waited
                turn.set_result(None)
                self._left -= 1
        if self._queue:
            self._end_pass_soon()


class Bound:
    """One event loop's connections: a pool, the ledger on it, the notice subscription."""

    def __init__(self, app: App, url: str, forget: Callable[[Bound], None]) -> None:
        self.url = url
        self.redis = app.async_redis(max_connections=CONNECTIONS_PER_LOOP)
        self.topology = t = app.topology
        # A Cluster's nodes raise when out of connections (App.async_redis): every
        # command on the loop's client, the ledger's and the reads outside it (a
        # submit's liveness read, lists, views), waits for a turn below that.
        in_flight = t.nodes.bound(self.redis, CONNECTIONS_PER_LOOP - CLUSTER_SPARE_CONNECTIONS)
        self.ledger = async_ledger_for(t, self.redis, app.settings.durability, in_flight)
        self.notifier = t.notices.async_notifier(
            self.redis, t.layout.channels(), t.layout.channels(steps=True)
        )
        #: The number of cells (none: the single tag) is checked against the ledger's
        #: meta once.
        self.unchecked = True
        self.turns = Turns(CALLS_PER_PASS)
        self._forget = forget
        self._closing = asyncio.Event()
        # Closes the connections when the loop shuts down (its tasks are cancelled)
        # or on aclose(): a pool left open would hold sockets of a closed loop.
        self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="toolq-aio")

    async def _keep(self) -> None:
        try:
            await self._closing.wait()
        finally:
            self._forget(self)
            await self.notifier.aclose()
            await self.topology.nodes.aclose(self.redis)

    async def aclose(self) -> None:
        self._closing.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._keeper


class Loops:
    """One :class:`Bound` per running event loop, made on first use; a loop's entry goes
    when its connections close."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.bound_to: dict[asyncio.AbstractEventLoop, Bound] = {}
        self._lock = threading.Lock()  # loops in several threads share the map

    async def bound(self) -> Bound:
        """This loop's connections, once it is this caller's turn (see :class:`Turns`)."""
        loop = running_loop()
        url = self.app.redis_url
        while True:
            with self._lock:
                b = self.bound_to.get(loop)
                if b is None:
                    self._drop_closed_loops()
                    if self.app.settings.client.freeze_heap:
                        heap.freeze_once()  # once per process: see toolq.process.heap
                    b = self.bound_to[loop] = Bound(self.app, url, self._forget)
            if b.url == url:
                await b.turns.take()
                if b.unchecked:
                    await b.ledger.record_cells()
                    b.unchecked = False
                return b
            await b.aclose()  # configure() pointed the app elsewhere since

    def current(self) -> Bound | None:
        """This loop's connections if it has made them (none made here)."""
        return self.bound_to.get(running_loop())

    def _forget(self, b: Bound) -> None:
        with self._lock:
            for loop, bound in list(self.bound_to.items()):
                if bound is b:
                    del self.bound_to[loop]

    def _drop_closed_loops(self) -> None:
        # A loop closed without cancelling its tasks never ran its keeper: nothing
        # can be awaited on it any more, so only the reference goes.
        for loop in [lp for lp in self.bound_to if lp.is_closed()]:
            del self.bound_to[loop]


def running_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "tq.aio runs on a running asyncio event loop (with anyio: the asyncio backend)"
        ) from None
