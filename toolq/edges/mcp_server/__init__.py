"""Every registered tool over MCP: ``toolq mcp`` (stdio, or streamable HTTP at ``/mcp``).

Built on the low-level ``mcp.server.Server`` for full control of results:

- Each tool is listed with its input schema, ``outputSchema`` = the envelope
  union (:func:`toolq.core.envelope.json_schema`) and annotations: ``readOnlyHint``
  for reads; ``destructiveHint`` and ``idempotentHint`` (from the registry)
  for writes. No success-only output model is declared, so an error envelope
  is never replaced by a validation message.
- A call is submitted through the queue under the client's
  ``_meta.operation_ref`` if it gives one (send the same ref again and you get
  the same operation: retries are safe), else under a fresh ``mcp_<uuid>``
  (an MCP request carries nothing stable across a client's retries, so two
  plain calls are two operations); ``_meta.call_id`` or the MCP request id
  becomes the call_id. It waits up to ``wait_seconds`` (default 20 s) on
  ``tq.aio``: no thread, no polling. A settled operation comes back as its
  envelope (:func:`toolq.core.render.to_mcp_result`: ``isError`` for ``ok=false``,
  the whole envelope in ``structuredContent``, ``agent_message`` and compact
  JSON in the text block). One still pending comes back as an
  ``OPERATION_PENDING`` envelope carrying its ``operation_ref``, to follow
  with the ``get_operation`` tool (or stop with ``cancel_operation``). Its
  commit_state is ``unknown`` (verify_operation) while a write's attempt may
  have started (running, verifying), else ``not_committed`` with
  ``after_delay``/``wait_and_retry``.
- Native tasks (:mod:`toolq.edges.mcp_server.tasks`): a request that declares the
  ``io.modelcontextprotocol/tasks`` extension gets ``resultType: "task"``
  (task id = operation_ref) for a call not finished within ``task_after``
  (default 1 s), then ``tasks/get``, ``tasks/update``, ``tasks/cancel``.
- Progress: when the request sent a progressToken, each state the operation
  enters and each ``CallContext.progress`` report of the tool reach the client
  as ``notifications/progress`` while the call waits
  (:mod:`toolq.edges.mcp_server.follow`).
- Every exception in the adapter becomes an allowlisted envelope (or a bare
  JSON-RPC error for ``tasks/*``) and a log line keyed by operation_ref; no
  exception text reaches the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
from mcp.server import Server

from toolq.edges.mcp_server.adapter import Adapter
from toolq.edges.mcp_server.envelopes import CANCEL_OPERATION, GET_OPERATION
from toolq.edges.mcp_server.tasks import TasksExtension, install

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue

__all__ = [
    "CANCEL_OPERATION",
    "GET_OPERATION",
    "Adapter",
    "TasksExtension",
    "create_server",
    "run_stdio",
    "serve_http",
]

INSTRUCTIONS = (
    "Every tool call runs through toolq's queue and returns an envelope. Pass "
    "_meta.operation_ref to make a call safe to repeat. If a call returns OPERATION_PENDING, "
    "follow its operation_ref with get_operation; never call the tool again for it. "
    "Clients with the io.modelcontextprotocol/tasks extension get a task instead."
)


# --------------------------------------------------------------------------- serving


def create_server(
    tq: ToolQueue,
    *,
    wait_seconds: float = 20.0,
    poll_interval: float = 1.0,
    task_after: float = 1.0,
) -> Server[Any]:
    """The MCP server for ``tq`` (connect ``mcp.Client(server)`` to it in tests)."""
    from toolq import __version__

    adapter = Adapter(
        tq, wait_seconds=wait_seconds, poll_interval=poll_interval, task_after=task_after
    )
    server: Server[Any] = Server(
        "toolq",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=adapter.list_tools,
        on_call_tool=adapter.call_tool,
    )
    install(server, TasksExtension(adapter), adapter.call_tool)
    return server


#: The answer to a line that is not a JSON-RPC message (JSON-RPC 2.0: a parse error,
#: ``id`` null), in toolq's words: the parser's would quote the line.
PARSE_ERROR_MESSAGE = "Parse error: the line is not a JSON-RPC message"


def run_stdio(tq: ToolQueue, **options: Any) -> None:
    """Serve MCP over stdin/stdout until the client closes it.

    A line that is not a JSON-RPC message is answered with a parse error (``-32700``,
    ``id`` null), as over HTTP: the SDK's stdio transport passes it to the server as
    an exception, which it logs at debug and answers with nothing, so a client that
    sent one waited for ever."""
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage
    from mcp.types import PARSE_ERROR, ErrorData, JSONRPCError

    server = create_server(tq, **options)
    refusal = JSONRPCError(
        jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message=PARSE_ERROR_MESSAGE)
    )

    async def main() -> None:
        async with stdio_server() as (read, write):
            sieved_writer, sieved = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def sieve() -> None:
                async with sieved_writer, read:
                    async for item in read:
                        if isinstance(item, Exception):
                            await write.send(SessionMessage(refusal))
                        else:
                            await sieved_writer.send(item)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sieve)
                await server.run(sieved, write, server.create_initialization_options())
                tg.cancel_scope.cancel()

    anyio.run(main)


def serve_http(
    tq: ToolQueue,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    log_level: str = "info",
    **options: Any,
) -> None:
    """Serve MCP over streamable HTTP at ``/mcp``; tokens as for the HTTP API.

    With tokens, every request needs the ``invoke`` scope. Without, loopback only.
    Only the hosts the HTTP API answers for are answered (:mod:`toolq.edges.api.hosts`):
    a foreign Host is refused (421) and so is a foreign Origin (403).
    """
    import sys

    from toolq.edges.api import sizes
    from toolq.edges.api.auth import ApiSettings, RequireScope, check_bind
    from toolq.edges.api.hosts import HostGuard, allowed_hosts, wildcard_note

    settings = ApiSettings()
    tokens = settings.token_table()
    check_bind(host, tokens, "mcp")
    allowed = allowed_hosts(host, settings.allowed_hosts)
    note = wildcard_note(host, settings.allowed_hosts, "mcp")
    if note is not None:
        print(note, file=sys.stderr)
    server = create_server(tq, **options)
    app: Any = server.streamable_http_app(host=host, transport_security=_security(allowed))
    if tokens:
        app = RequireScope(app, tokens, "invoke")
    app = sizes.guarded(HostGuard(app, allowed), settings)
    sizes.run(app, settings, host=host, port=port, log_level=log_level)


def _security(allowed: frozenset[str]) -> Any:
    """The SDK's own Host/Origin check, on the same list as :class:`HostGuard` in front."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = sorted(f"[{n}]" if ":" in n else n for n in allowed)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for n in names for h in (n, f"{n}:*")],
        allowed_origins=[
            f"{scheme}://{n}{port}"
            for n in names
            for scheme in ("http", "https")
            for port in ("", ":*")
        ],
    )
