"""Following one operation on ``tq.aio`` for the length of an MCP request.

The wait itself is ``aio.wait`` (it wakes on the ref's notice: no thread, no
polling). Beside it, when the request carried a ``progressToken``, a watch of
the ref turns each state entered and each ``CallContext.progress`` report into
a ``notifications/progress`` (best effort: the answer is what counts).

Progress values count the notifications sent (1, 2, 3, ...): MCP wants them
strictly increasing, and a state entered has no fraction; a tool's fraction is
in the message ("40% fetching pages").
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server import ServerRequestContext

from toolq.core.envelope import AnyEnvelope
from toolq.core.states import SETTLED, State
from toolq.edges.mcp_server.taskview import describe, progress_text

if TYPE_CHECKING:
    from toolq.client.aio import AsyncToolQueue

log = logging.getLogger("toolq.mcp")

#: How long a settled call's watch may take to relay what it still holds (it
#: has it already: the notices it relays arrived before the one that settled it).
TELL_THE_END_S = 1.0


class Reporter:
    """``notifications/progress`` for one request; silent if it asked for none."""

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        meta: dict[str, Any] = dict(ctx.meta or {})
        self.ctx = ctx
        # The SDK parses the wire's progressToken into its typed name.
        self.wanted = meta.get("progress_token", meta.get("progressToken")) is not None
        self.sent = 0
        self.said: str | None = None
        self.state: State | None = None

    async def say(self, message: str) -> None:
        if not self.wanted or message == self.said:
            return
        self.sent, self.said = self.sent + 1, message
        try:
            await self.ctx.session.report_progress(float(self.sent), None, message)
        except Exception:  # progress is best effort; the call's answer is what matters
            log.debug("progress notification failed", exc_info=True)

    async def entered(self, state: State, envelope: AnyEnvelope | None) -> None:
        self.state = state
        await self.say(describe(state, envelope))

    async def relay(self, aio: AsyncToolQueue, ref: str) -> None:
        """Report what the watch of ``ref`` hears (first the state it is in), until
        it settles or this is cancelled."""
        events = aio.watch(ref)
        try:
            async for ev in events:
                if ev.progress is not None:
                    await self.say(progress_text(ev.progress.fraction, ev.progress.message))
                elif ev.state is not None:
                    await self.entered(ev.state, ev.envelope)
        finally:
            # Unwatch now, not when the generator is collected; shielded, since this
            # runs when the request's wait is over and the relay is being cancelled.
            close = getattr(events, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()


async def settle(
    aio: AsyncToolQueue, ref: str, seconds: float, reporter: Reporter
) -> AnyEnvelope | None:
    """Wait up to ``seconds`` for ``ref`` to settle: its envelope, or None if it did not.

    ``aio.wait`` answers early only for a settled operation; at the deadline it
    may answer with the current (unsettled) error envelope, so an answer at the
    deadline counts as "not settled" and the caller reads the record.
    :class:`toolq.core.errors.OperationNotFound` if there is no such operation.
    """
    deadline = anyio.current_time() + max(0.0, seconds)
    env: AnyEnvelope | None = None
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        if reporter.wanted:
            tg.start_soon(_relay, reporter, aio, ref)
        try:
            env = await aio.wait(ref, timeout=max(0.0, seconds))
        except TimeoutError:
            env = None
        except Exception as exc:  # raised below, not wrapped in the group's ExceptionGroup
            failed = exc
        if env is not None and anyio.current_time() >= deadline:
            env = None
        if env is None:
            tg.cancel_scope.cancel()
        else:
            # The watch ends by itself once it has told the settled state, after the
            # progress published before it: let it, so the client hears them in order.
            tg.cancel_scope.deadline = anyio.current_time() + TELL_THE_END_S
    if failed is not None:
        raise failed
    if env is not None and reporter.wanted and reporter.state not in SETTLED:
        rec = await aio.get(ref)  # the watch was stopped before it heard the end
        if rec is not None:
            await reporter.entered(rec.state, rec.envelope)
    return env


async def _relay(reporter: Reporter, aio: AsyncToolQueue, ref: str) -> None:
    try:
        await reporter.relay(aio, ref)
    except Exception:  # a watch that fails costs progress, never the answer
        log.debug("progress watch of %s failed", ref[:80], exc_info=True)
