"""``toolq api`` and ``toolq mcp``: the app's tools over HTTP and over MCP."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from toolq.edges.cli.common import (
    LOGLEVEL,
    CliError,
    Seconds,
    app_option,
    check_port,
    handle_errors,
    open_app,
    redis_option,
    state_dir_option,
)
from toolq.process.logs import install_redaction

TOKENS_HELP = (
    "Tokens come from TOOLQ_API_TOKENS='TOKEN=scope,scope;TOKEN=scope' (scopes: read, invoke, "
    "approve, input, cancel, or *; tokens of 16+ characters). Without tokens there is no "
    "authentication, and only a loopback --host is allowed. Requests are answered only for "
    "Host localhost, 127.0.0.1, [::1], the --host address (unless 0.0.0.0 or ::) and the "
    "names in TOOLQ_API_ALLOWED_HOSTS=name,name (any port; else 421), and refused from a "
    "browser Origin on any other host (403). The console at /ui/ logs in with the same "
    "tokens; without tokens it needs no login and, like the API, serves loopback only."
)


def _settings() -> Any:
    from toolq.edges.api.auth import ApiSettings

    try:
        settings = ApiSettings()
        settings.token_table()
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        raise CliError(f"invalid TOOLQ_API_* setting: {fields}") from None
    except ValueError as exc:  # the token table; its messages never quote a token
        raise CliError(str(exc)) from None
    return settings


def _check_console_settings() -> None:
    from toolq.edges.api.console.session import ConsoleSettings

    try:
        ConsoleSettings()
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
        raise CliError(f"invalid TOOLQ_CONSOLE_* setting: {fields}") from None


def _bind(host: str, settings: Any, what: str) -> None:
    from toolq.edges.api.auth import bind_refusal

    refusal = bind_refusal(host, settings.token_table(), what)
    if refusal is not None:
        raise CliError(refusal)


@click.command(epilog=TOKENS_HELP)
@app_option
@redis_option
@state_dir_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--loglevel", "-l", type=LOGLEVEL, default="INFO", show_default=True)
@handle_errors
def api(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    host: str,
    port: int,
    loglevel: str,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json, docs at /docs) and the operator's
    console at /ui/ (log in with a token; TOOLQ_CONSOLE_* settings)."""
    install_redaction()
    _log_to_stderr(loglevel)
    settings = _settings()
    _check_console_settings()
    _bind(host, settings, "api")
    check_port(host, port, "the API")
    from toolq.edges.api.app import serve_api

    tq = open_app(app_path, redis_url, state_dir, away="serve")
    try:
        serve_api(tq, host, port, settings=settings, log_level=loglevel)
    finally:
        tq.close()


@click.command(name="mcp", epilog=TOKENS_HELP)
@app_option
@redis_option
@state_dir_option
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio, or streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@click.option(
    "--wait-seconds",
    type=Seconds(0, 300),
    default=20.0,
    show_default=True,
    help="How long a call waits for its operation before answering pending.",
)
@click.option("--loglevel", "-l", type=LOGLEVEL, default="WARNING", show_default=True)
@handle_errors
def mcp_command(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    transport: str,
    host: str,
    port: int,
    wait_seconds: float,
    loglevel: str,
) -> None:
    """Serve every tool over MCP; calls run through the queue.

    A call waits up to --wait-seconds; one still pending answers OPERATION_PENDING
    with its operation_ref, which the get_operation tool follows.
    """
    install_redaction()
    _log_to_stderr(loglevel)  # stdout is the protocol on stdio
    from toolq.edges.mcp_server import CANCEL_OPERATION, GET_OPERATION, run_stdio, serve_http

    if transport == "http":
        _bind(host, _settings(), "mcp")
        check_port(host, port, "MCP")
    tq = open_app(app_path, redis_url, state_dir, away="serve")
    clash = sorted({GET_OPERATION, CANCEL_OPERATION} & {t.name for t in tq.registry})
    if clash:
        raise CliError(f"tool names clash with the MCP server's own tools: {', '.join(clash)}")
    try:
        if transport == "stdio":
            run_stdio(tq, wait_seconds=wait_seconds)
        else:
            serve_http(tq, host, port, log_level=loglevel, wait_seconds=wait_seconds)
    finally:
        tq.close()


def _log_to_stderr(loglevel: str) -> None:
    """toolq's own lines (an outage of the queue server and its end, an unexpected
    error) on stderr at ``loglevel``, timestamped as the worker's; uvicorn's own
    loggers keep their handlers."""
    logging.basicConfig(
        level=loglevel.upper(),
        stream=sys.stderr,
        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s",
    )


COMMANDS = [api, mcp_command]
