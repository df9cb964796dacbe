"""``tq.deps`` and ``tq.aio.deps``: the dependency keys an operator sees and settles.

    for dep in tq.deps.list(): print(dep.key, dep.breaker, dep.waiting)
    tq.deps.lift("stripe", reason="Stripe says the incident is over")
    await tq.aio.deps.close("stripe:acct_1", reason="probe stuck; provider is back")

A key is listed once the ledger has limited a call with it
(:mod:`toolq.adapters.ledger.dep_state` reads the limiter's stored state). Lifting a
pause or closing a breaker records who, when and why on the key, and makes the calls it
holds back due now, spread over a moment.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from toolq.adapters.ledger.dep_state import AsyncDepState, DepActed, DepDetail, DepState
from toolq.adapters.outage import server_errors
from toolq.decisions.dep_actions import DepAction

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from toolq.client.app import App

__all__ = ["AsyncDeps", "DepActed", "DepDetail", "Deps"]


class Deps:
    """``tq.deps``: the dependency keys, sync."""

    def __init__(self, app: App) -> None:
        self.app = app

    def _state(self) -> DepState:
        ledger = self.app.ledger
        return DepState(self.app.redis, self.app.topology.layout, ledger.scripts)

    @server_errors
    def list(self) -> list[DepDetail]:
        """Every key the ledger has limited, by key."""
        return self._state().views(self.app.now_ms())

    @server_errors
    def show(self, key: str) -> DepDetail:
        """One key; InvalidDependencyKey, UnknownDependency."""
        return self._state().view(key, self.app.now_ms())

    @server_errors
    def lift(self, key: str, *, reason: str, by: str = "operator:lift") -> DepActed:
        """End the key's pause now (DependencyActionRefused NOT_PAUSED if there is none)."""
        return self._state().act(
            key, DepAction.LIFT, by=by, reason=reason, now_ms=self.app.now_ms()
        )

    @server_errors
    def close(self, key: str, *, reason: str, by: str = "operator:close") -> DepActed:
        """Close the key's open or half-open breaker (BREAKER_CLOSED if it is closed)."""
        return self._state().act(
            key, DepAction.CLOSE, by=by, reason=reason, now_ms=self.app.now_ms()
        )


class AsyncDeps:
    """``tq.aio.deps``: :class:`Deps` awaited, on the loop's own client."""

    def __init__(self, app: App, client: Callable[[], Awaitable[aioredis.Redis]]) -> None:
        self.app = app
        #: This loop's client (``tq.aio.client``).
        self.client = client

    async def _state(self) -> AsyncDepState:
        return AsyncDepState(await self.client(), self.app.topology.layout)

    @server_errors
    async def list(self) -> list[DepDetail]:
        return await (await self._state()).views(self.app.now_ms())

    @server_errors
    async def show(self, key: str) -> DepDetail:
        return await (await self._state()).view(key, self.app.now_ms())

    @server_errors
    async def lift(self, key: str, *, reason: str, by: str = "operator:lift") -> DepActed:
        state = await self._state()
        return await state.act(key, DepAction.LIFT, by=by, reason=reason, now_ms=self.app.now_ms())

    @server_errors
    async def close(self, key: str, *, reason: str, by: str = "operator:close") -> DepActed:
        state = await self._state()
        return await state.act(key, DepAction.CLOSE, by=by, reason=reason, now_ms=self.app.now_ms())
