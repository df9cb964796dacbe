"""The MCP handlers over one ToolQueue: tools/list and tools/call, on ``tq.aio``.

A call is submitted and followed with the async client: the handler awaits the
operation's notice, holding no thread, and polls nothing. See the package
docstring for what a call answers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp import types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from toolq.core import errors
from toolq.core.envelope import AnyEnvelope, FieldError, ToolError, json_schema
from toolq.core.render import to_mcp_result
from toolq.core.states import SETTLED, TERMINAL
from toolq.core.tools import field_errors_of
from toolq.edges.api.auth import SCOPES
from toolq.edges.mcp_server import taskview
from toolq.edges.mcp_server.envelopes import (
    CANCEL_OPERATION,
    GET_OPERATION,
    CancelArgs,
    FollowArgs,
    builtin_args,
    forbidden_envelope,
    pending_envelope,
    refused_envelope,
    unavailable_envelope,
    unexpected_envelope,
)
from toolq.edges.mcp_server.follow import Reporter, settle
from toolq.process.waiting import Outage, Watch

if TYPE_CHECKING:
    from toolq.client.aio import AsyncToolQueue
    from toolq.client.queue import ToolQueue

log = logging.getLogger("toolq.mcp")


class Adapter:
    """The MCP handlers over one ToolQueue.

    ``wait_seconds``: how long a plain call waits before it answers
    ``OPERATION_PENDING``. ``task_after``: how long a call from a client with
    the tasks extension waits before it answers with a task instead.
    ``poll_interval``: what pending answers and tasks tell clients to poll at.
    """

    def __init__(
        self,
        tq: ToolQueue,
        *,
        wait_seconds: float = 20.0,
        poll_interval: float = 1.0,
        task_after: float = 1.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.tq, self.wait_seconds, self.poll, self.clock = tq, wait_seconds, poll_interval, clock
        self.task_after = task_after
        self.aio: AsyncToolQueue = tq.aio
        limits = tq.settings.limits
        self.is_ref = limits.is_ref
        self.follow_args, self.cancel_args = builtin_args(limits)
        #: The queue server's outages, said once however many calls answer
        #: QUEUE_UNAVAILABLE meanwhile.
        outage = Outage("queue server", "ledger", meanwhile="calls answer QUEUE_UNAVAILABLE")
        self.watch = Watch(outage, lambda: self.aio.ping(), log)
        for name in (GET_OPERATION, CANCEL_OPERATION):
            if name in tq.registry:
                raise ValueError(f"tool {name!r} clashes with the MCP server's own tool")

    def _unavailable(
        self,
        exc: errors.ServerUnavailable,
        ref: str,
        tool: str | None,
        call_id: str | None,
        *,
        writes: bool,
    ) -> ToolError:
        """QUEUE_UNAVAILABLE for the agent (a write that may have been queued: follow
        the ref first), said once an outage in the log."""
        self.watch.failed(exc, str(exc))
        shown = tool[:64] if tool is not None and tool in self.tq.registry else None
        return unavailable_envelope(
            ref, shown, call_id, writes=writes, now=self.clock(), poll=self.poll
        )

    # ------------------------------------------------------------------ tools/list

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            return types.ListToolsResult(tools=self.tools())
        except Exception:
            log.exception("tools/list failed")
            raise MCPError(code=types.INTERNAL_ERROR, message="internal error") from None

    def tools(self) -> list[types.Tool]:
        envelope = json_schema()
        listed = [
            types.Tool(
                name=t.name,
                description=t.options.description or None,
                input_schema=t.input_schema(),
                output_schema=envelope,
                annotations=types.ToolAnnotations(
                    read_only_hint=not t.writes,
                    open_world_hint=True,
                    destructive_hint=True if t.writes else None,
                    idempotent_hint=t.options.idempotent if t.writes else None,
                ),
            )
            for t in self.tq.registry
        ]
        follow = types.Tool(
            name=GET_OPERATION,
            input_schema=self.follow_args.model_json_schema(),
            description="Read an operation by operation_ref, waiting up to wait_seconds for it "
            "to settle; returns its envelope (OPERATION_PENDING while it runs).",
            output_schema=envelope,
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
        cancel = types.Tool(
            name=CANCEL_OPERATION,
            input_schema=self.cancel_args.model_json_schema(),
            description="Cancel an operation that has not started a write (queued or waiting).",
            output_schema=envelope,
            annotations=types.ToolAnnotations(
                read_only_hint=False, destructive_hint=False, idempotent_hint=True
            ),
        )
        return [*listed, follow, cancel]

    # ------------------------------------------------------------------ tools/call

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """``tools/call`` for a client without the tasks extension: always an envelope."""
        result = await self.answer(ctx, params, tasks=False)
        assert isinstance(result, types.CallToolResult)  # only ``tasks`` makes a task
        return result

    async def answer(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, *, tasks: bool
    ) -> types.CallToolResult | dict[str, Any]:
        """The ``tools/call`` result: a ``CallToolResult``, or (``tasks``, for a call of a
        tool that has not finished within ``task_after``) a ``CreateTaskResult`` dict."""
        try:
            out = await self._call(ctx, params, tasks=tasks)
        except Exception as exc:  # the last resort: even an envelope failed to build
            log.exception("MCP call could not be answered")
            ref = f"mcp_{uuid.uuid4().hex}"
            out = unexpected_envelope(exc, ref, None, None, may_have_submitted=False)
        if isinstance(out, dict):
            return out
        return types.CallToolResult.model_validate(to_mcp_result(out))

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, *, tasks: bool
    ) -> AnyEnvelope | dict[str, Any]:
        meta: dict[str, Any] = dict(params.meta or ctx.meta or {})
        call_id = self._text(meta.get("call_id")) or self._text(ctx.request_id) or None
        ref = f"mcp_{uuid.uuid4().hex}"
        tool, submitted = params.name, False
        try:
            args = params.arguments or {}
            if tool in (GET_OPERATION, CANCEL_OPERATION):
                return await self._builtin(ctx, tool, args, call_id)
            given = meta.get("operation_ref")
            if given is not None:
                if not isinstance(given, str) or not self.is_ref(given):
                    raise errors.InvalidArguments(
                        "bad operation_ref",
                        field_errors=[FieldError(field="_meta.operation_ref", rule="pattern")],
                    )
                ref = given
            submitted = True
            sub = await self.aio.submit(tool, args, operation_ref=ref, call_id=call_id)
            if tasks:
                return await self._task(ctx, sub.operation_ref)
            return await self.follow(ctx, sub.operation_ref, self.wait_seconds)
        except errors.ServerUnavailable as exc:
            return self._unavailable(
                exc, ref, tool, call_id, writes=submitted and self._writes(tool)
            )
        except errors.RequestRefused as exc:
            return refused_envelope(exc, ref, tool, call_id, self._max_attempts(tool))
        except Exception as exc:
            log.exception("MCP call of %s failed for %s", tool[:64], ref)
            return unexpected_envelope(
                exc,
                ref,
                tool[:64] if tool in self.tq.registry else None,
                call_id,
                may_have_submitted=submitted and self._writes(tool),
            )

    async def _task(self, ctx: ServerRequestContext[Any], ref: str) -> AnyEnvelope | dict[str, Any]:
        """A finished operation's envelope, or a task for one still under way (or waiting
        on a person: the task's ``input_required`` is how its client answers)."""
        await settle(self.aio, ref, self.task_after, Reporter(ctx))
        rec = await self.aio.get(ref)
        if rec is None:
            raise errors.OperationNotFound("no such operation")
        if rec.state in TERMINAL:
            return taskview.final_envelope(rec)
        return taskview.created(rec, poll=self.poll, now=self.clock())

    async def _builtin(
        self, ctx: ServerRequestContext[Any], tool: str, args: dict[str, Any], call_id: str | None
    ) -> AnyEnvelope:
        try:
            model = self.follow_args if tool == GET_OPERATION else self.cancel_args
            parsed: FollowArgs | CancelArgs = model.model_validate(args)
        except ValidationError as exc:
            raise errors.InvalidArguments(
                "bad arguments", field_errors=field_errors_of(exc)
            ) from None
        ref = parsed.operation_ref
        if isinstance(parsed, CancelArgs) and "cancel" not in scopes(ctx):
            return forbidden_envelope(ref, call_id, "cancel")
        try:
            if isinstance(parsed, FollowArgs):
                wait = self.wait_seconds if parsed.wait_seconds is None else parsed.wait_seconds
                return await self.follow(ctx, ref, wait)
            await self.aio.cancel(ref, by="mcp:cancel_operation")
            return await self.aio.wait(ref, 0.0)
        except errors.ServerUnavailable as exc:
            return self._unavailable(exc, ref, None, call_id, writes=False)
        except errors.RequestRefused as exc:
            return refused_envelope(exc, ref, None, call_id)
        except Exception as exc:  # a read of an existing operation: nothing was submitted
            log.exception("MCP %s failed for %s", tool, ref)
            return unexpected_envelope(exc, ref, None, call_id, may_have_submitted=False)

    async def follow(
        self, ctx: ServerRequestContext[Any], ref: str, wait_seconds: float
    ) -> AnyEnvelope:
        """Wait up to ``wait_seconds`` for ``ref`` to settle, reporting progress on the way;
        an ``OPERATION_PENDING`` envelope if it does not."""
        env = await settle(self.aio, ref, wait_seconds, Reporter(ctx))
        if env is not None:
            return env
        rec = await self.aio.get(ref)
        if rec is None:
            raise errors.OperationNotFound("no such operation")
        if rec.state in SETTLED:  # it settled right at the deadline
            return await self.aio.wait(ref, 0.0)
        return pending_envelope(
            rec, writes=self._writes(rec.tool), poll=self.poll, now=self.clock()
        )

    def _writes(self, tool: str) -> bool:
        # An unknown tool name is treated as a write: the cautious reading.
        return tool not in self.tq.registry or self.tq.registry.get(tool).writes

    def _text(self, value: object) -> str | None:
        """``value`` as a call_id, if it is a ref-shaped string or number."""
        if isinstance(value, bool) or not isinstance(value, str | int):
            return None
        text = str(value)
        return text if self.is_ref(text) else None

    def _max_attempts(self, tool: str) -> int:
        return self.tq.registry.get(tool).options.max_attempts if tool in self.tq.registry else 1


def scopes(ctx: ServerRequestContext[Any]) -> frozenset[str]:
    """What the HTTP transport's token allows; everything on stdio or without tokens."""
    scope = getattr(ctx.request, "scope", None)
    granted = scope.get("toolq.scopes") if isinstance(scope, dict) else None
    return granted if isinstance(granted, frozenset) else SCOPES
