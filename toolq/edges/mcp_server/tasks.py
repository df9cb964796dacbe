"""Native MCP tasks: the ``io.modelcontextprotocol/tasks`` extension (SEP-2663).

Built on the SDK's extension mechanism (:class:`mcp.server.extension.Extension`):
``tools/call`` is intercepted, and ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` are served. A task's id is its operation_ref, so a task is as
durable as the operation (the ledger holds it before ``tools/call`` answers).

Only a request that declares the extension in its own ``_meta`` client
capabilities (2026-07-28) gets a task; other clients keep the
``OPERATION_PENDING`` envelope and ``get_operation``. A call whose tool has not
finished within ``task_after`` answers ``resultType: "task"``, also when it
waits on a person (``input_required``: ``tasks/update`` answers it). How toolq's
states read as task statuses: :mod:`toolq.edges.mcp_server.taskview`.

Refusals are the JSON-RPC errors the extension names, and nothing is written
for them:

- the request did not declare the extension: ``-32021`` (missing required
  client capability) with ``requiredCapabilities``;
- over HTTP, an ``Mcp-Name`` header that is not the ``taskId``: ``-32020``;
- an unknown (or expired) task id, cancelling a task that has completed, an
  answer that is not an elicitation result, corrected arguments that do not
  validate: ``-32602`` (invalid params);
- a token without the scope the action needs (``cancel``; ``approve`` to
  approve, ``input`` for corrected arguments): ``-32600``.

``tasks/cancel`` of a call that has started is acknowledged, as the extension
requires, but not carried out (toolq never stops a write mid-way): the
acknowledgement's ``_meta["toolq/cancel"]`` says so, and the task runs on to
its end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mcp import types
from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.extension import (
    Extension,
    MethodBinding,
    RequestHandler,
    compose_tool_call_handler,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types.jsonrpc import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from toolq.core import errors
from toolq.core.record import OperationRecord
from toolq.core.states import TERMINAL, State
from toolq.decisions.recovery.operator import CANCELLABLE
from toolq.edges.mcp_server import taskview
from toolq.edges.mcp_server.adapter import Adapter, scopes
from toolq.edges.mcp_server.envelopes import CANCEL_OPERATION, GET_OPERATION

if TYPE_CHECKING:
    from mcp.server import Server

log = logging.getLogger("toolq.mcp")
P = TypeVar("P", bound="TaskParams")

#: Who an action taken through the extension is recorded as, in the history.
BY = "mcp:tasks"


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class TasksExtension(Extension):
    """``io.modelcontextprotocol/tasks`` over one :class:`Adapter`."""

    identifier = taskview.EXTENSION

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._guarded(self.get)),
            MethodBinding("tasks/update", UpdateParams, self._guarded(self.update)),
            MethodBinding("tasks/cancel", TaskParams, self._guarded(self.cancel)),
        )

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if not declared(ctx) or params.name in (GET_OPERATION, CANCEL_OPERATION):
            return await call_next(ctx)
        return await self.adapter.answer(ctx, params, tasks=True)

    # ------------------------------------------------------------------ methods

    async def get(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        rec = await self._record(ctx, params, "retrieve")
        a = self.adapter
        tool = a.tq.registry.get(rec.tool) if rec.tool in a.tq.registry else None
        return taskview.detailed(
            rec,
            poll=a.poll,
            now=a.clock(),
            input_schema=tool.input_schema() if tool is not None else None,
        )

    async def cancel(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        rec = await self._record(ctx, params, "cancel")
        _need(ctx, "cancel")
        _not_completed(rec)
        if rec.state not in CANCELLABLE and rec.state is not State.CANCELLED:
            return _cancel_ack(rec.state)
        try:
            await self.adapter.aio.cancel(rec.operation_ref, by=BY)
        except errors.InvalidState:  # it started (or moved on) since it was read
            rec = await self._record(ctx, params, "cancel")
            _not_completed(rec)
        except errors.OperationNotFound:  # gone (retention) since it was read
            raise _not_found("cancel") from None
        else:
            return _cancel_ack(State.CANCELLED)
        return _cancel_ack(rec.state)

    async def update(self, ctx: ServerRequestContext[Any], params: UpdateParams) -> dict[str, Any]:
        rec = await self._record(ctx, params, "update")
        try:
            answer = taskview.answer(rec, params.input_responses)
        except taskview.BadAnswer as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"Failed to update task: {exc}") from None
        aio, ref = self.adapter.aio, rec.operation_ref
        try:
            if answer.action == "approve":
                _need(ctx, "approve")
                await aio.approve(ref, by=BY)
            elif answer.action == "input":
                _need(ctx, "input")
                await aio.provide_input(ref, answer.arguments, by=BY)
            elif answer.action == "cancel":
                _need(ctx, "cancel")
                await aio.cancel(ref, by=BY)
        except errors.InvalidArguments as exc:
            fields = [f.model_dump() for f in exc.field_errors[:20]]
            raise MCPError(
                code=INVALID_PARAMS,
                message="Failed to update task: the corrected arguments do not validate",
                data={"code": exc.details.get("code_hint") or exc.code, "fieldErrors": fields},
            ) from None
        except errors.InvalidState:
            pass  # answered meanwhile: no longer outstanding, and the extension says ignore it
        except errors.ServerUnavailable:
            raise  # said as every handler's (_guarded)
        except errors.RequestRefused as exc:  # gone meanwhile, or its tool is not served here
            raise MCPError(
                code=INVALID_PARAMS, message=f"Failed to update task: {exc.code}"
            ) from None
        return {"resultType": "complete"}

    # ------------------------------------------------------------------ shared

    async def _record(
        self, ctx: ServerRequestContext[Any], params: TaskParams, verb: str
    ) -> OperationRecord:
        """The operation behind ``params.taskId``; every refusal before any ledger read."""
        require_declared(ctx)
        check_name(ctx, params.task_id)
        if not self.adapter.is_ref(params.task_id):
            raise _not_found(verb)
        rec = await self.adapter.aio.get(params.task_id)
        if rec is None:
            raise _not_found(verb)
        return rec

    def _guarded(
        self, handler: Callable[[ServerRequestContext[Any], P], Awaitable[dict[str, Any]]]
    ) -> Callable[[ServerRequestContext[Any], P], Awaitable[dict[str, Any]]]:
        """``handler``, with anything unexpected turned into a bare internal error."""

        async def run(ctx: ServerRequestContext[Any], params: P) -> dict[str, Any]:
            try:
                return await handler(ctx, params)
            except MCPError:
                raise
            except errors.ServerUnavailable as exc:
                self.adapter.watch.failed(exc, str(exc))
                raise MCPError(
                    code=INTERNAL_ERROR,
                    message="The queue's server is unavailable; the same request again is safe",
                    data={"code": exc.code},
                ) from None
            except Exception:
                log.exception("MCP %s failed for %s", ctx.method, params.task_id[:80])
                raise MCPError(code=INTERNAL_ERROR, message="Internal error") from None

        return run


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request declared the extension (in its own 2026-07-28 envelope)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = ctx.session.client_capabilities
    return caps is not None and taskview.EXTENSION in (caps.extensions or {})


def require_declared(ctx: ServerRequestContext[Any, Any]) -> None:
    if not declared(ctx):
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message="Missing required client capability",
            data={"requiredCapabilities": {"extensions": {taskview.EXTENSION: {}}}},
        )


def check_name(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """Over HTTP, ``Mcp-Name`` must carry the ``taskId`` (the extension's routing header)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:  # stdio, in memory: there is no header to route on
        return
    if decode_header_value(headers.get(MCP_NAME_HEADER)) != task_id:
        raise MCPError(
            code=HEADER_MISMATCH,
            message=f"{MCP_NAME_HEADER} header does not match the request's taskId",
        )


def _not_found(verb: str) -> MCPError:
    # The same words for a malformed id and an unknown (or expired) one.
    return MCPError(code=INVALID_PARAMS, message=f"Failed to {verb} task: Task not found")


def _need(ctx: ServerRequestContext[Any], scope: str) -> None:
    if scope not in scopes(ctx):
        raise MCPError(
            code=INVALID_REQUEST,
            message=f"This token may not do that: it needs the {scope} scope",
            data={"code": "FORBIDDEN_SCOPE", "scope": scope},
        )


def _not_completed(rec: OperationRecord) -> None:
    if rec.state in TERMINAL and rec.state is not State.CANCELLED:
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"Failed to cancel task: it has already completed ({rec.state})",
        )


def _cancel_ack(state: State) -> dict[str, Any]:
    """The extension's empty acknowledgement, saying whether toolq cancelled it."""
    if state is State.CANCELLED:
        said: dict[str, Any] = {"cancelled": True}
    else:
        said = {
            "cancelled": False,
            "state": str(state),
            "message": "The call has started and may have taken effect; toolq does not "
            "stop it. Follow the task to its end.",
        }
    return {"resultType": "complete", "_meta": {"toolq/cancel": said}}


def install(server: Server[Any], extension: Extension, call_tool: RequestHandler) -> None:
    """Apply ``extension`` to a low-level ``server`` as ``MCPServer(extensions=...)`` does:
    its methods, its capability, and its interceptor around ``call_tool``."""
    for method in extension.methods():
        if server.get_request_handler(method.method) is not None:
            raise ValueError(f"method {method.method!r} is already served")
        server.add_request_handler(method.method, method.params_type, method.handler)
    server.extensions[extension.identifier] = extension.settings()
    server.add_request_handler(
        "tools/call",
        types.CallToolRequestParams,
        compose_tool_call_handler([extension], call_tool),
    )
