"""``toolq up``: the whole local stack, in the foreground (``toolq demo`` is
:mod:`toolq.edges.cli.demo`, registered here)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from toolq.adapters.stack_state import clear_state, mode_of, owner, read_state, write_state
from toolq.core.redact import redact_url
from toolq.edges.cli.common import (
    AWAY,
    DEFAULT_APP,
    LOGLEVEL,
    CliError,
    app_option,
    bindable,
    load_app,
    redis_option,
    server_said,
    state_dir_option,
)
from toolq.edges.cli.demo import demo
from toolq.edges.cli.foreground import Interrupts, Supervisor


def _ports(wanted: dict[str, tuple[int | None, str]]) -> dict[str, int | None]:
    """The ports ``toolq up`` serves on, by name (``metrics``, ``api``) from (port, host):
    0 picks a free port, None stays off. Every port in use is refused now, all of them in
    one message, before anything starts (not the first, then the next on the next run)."""
    from toolq.edges.stack import free_port

    taken = [
        f"port {port} for {what} on {host} is in use: pass --{what}-port 0 (any free port) "
        "or another port"
        for what, (port, host) in wanted.items()
        if port and not bindable(host, port)
    ]
    if len(taken) == 1:
        raise CliError(taken[0])
    if taken:
        raise CliError("\n".join([f"{len(taken)} ports are in use:", *taken]))
    return {what: free_port() if port == 0 else port for what, (port, host) in wanted.items()}


def _api_available() -> bool:
    """The HTTP API is the ``api`` extra: served only when FastAPI and uvicorn are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))


def _ping(url: str) -> bool:
    """Whether the server at ``url`` answers, checked before anything starts. Away:
    said in one line, and the stack starts anyway (each process waits for it, the API
    answers 503 until it answers: a long-running process does not exit because a
    dependency is away). Answering with a refusal (a database it does not have): one
    line, and nothing starts."""
    import redis

    from toolq.core.settings import ToolqSettings
    from toolq.process.waiting import HINTS

    ToolqSettings(redis_url=url)  # malformed: one line (invalid settings), not redis-py's traceback
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except AWAY as exc:
        why = type(exc).__name__
        hint = HINTS.get(why)
        click.echo(
            f"toolq up: the server at {redact_url(url)} does not answer "
            f"({why}{': ' + hint if hint else ''}); starting anyway: every process waits "
            "for it",
            err=True,
        )
        return False
    except (redis.RedisError, ValueError) as exc:
        raise CliError(server_said(url, exc)) from None
    finally:
        client.close()
    return True


def _check_cluster(redis_url: str | None) -> None:
    """``TOOLQ_CLUSTER`` on and no URL: refused before anything starts (the embedded
    server is a single node; its clients would fail after their timeouts). Read before
    the settings are validated, so that this is the sentence whatever else is set."""
    raw = os.environ.get("TOOLQ_CLUSTER", "")
    if redis_url or not raw.strip():
        return
    from pydantic import TypeAdapter, ValidationError

    try:
        cluster = TypeAdapter(bool).validate_python(raw.strip())
    except ValidationError:
        return  # the settings say what is wrong with it
    if cluster:
        raise CliError(
            "TOOLQ_CLUSTER=1 needs the URL of the Cluster's nodes (--redis-url or "
            "TOOLQ_REDIS_URL): `toolq up` alone starts one embedded server, not a Cluster"
        )


def _check_not_running(state_dir: Path) -> None:
    data = read_state(state_dir)
    pid = data.get("pid") if data else None
    if isinstance(pid, int) and pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return  # a stale file from a run that was killed
        except PermissionError:
            pass
        raise CliError(f"toolq up is already running here (pid {pid}, state in {state_dir})")


PORT = click.IntRange(0, 65535)
COUNT = click.IntRange(0, 64)
POOLS = ["prefork", "threads", "solo"]


@click.command()
@app_option
@redis_option
@state_dir_option
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Embedded Valkey's data directory (append-only file on) [default: STATE_DIR/data].",
)
@click.option("--calls-workers", type=COUNT, default=1, show_default=True)
@click.option("--verify-workers", type=COUNT, default=1, show_default=True)
@click.option("--concurrency", "-c", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--pool", "-P", type=click.Choice(POOLS), default="threads", show_default=True)
@click.option(
    "--metrics-port",
    type=PORT,
    default=9464,
    show_default=True,
    help="The scheduler serves Prometheus metrics here (0: any free port).",
)
@click.option("--no-metrics", is_flag=True, help="Serve no metrics endpoint.")
@click.option(
    "--api/--no-api",
    default=True,
    show_default=True,
    help="Run `toolq api` too: the HTTP API, and the operator's console at /ui/.",
)
@click.option("--api-host", default="127.0.0.1", show_default=True)
@click.option("--api-port", type=PORT, default=8000, show_default=True, help="0: any free port.")
@click.option(
    "--example-provider/--no-example-provider",
    default=None,
    help="Serve the example invoice provider for the example tools [default: when "
    "the app is the example and TOOLQ_EXAMPLE_PROVIDER_URL is unset].",
)
@click.option(
    "--events",
    "-E",
    is_flag=True,
    help="Workers send Celery task events, for Flower (off by default, as in Celery).",
)
@click.option("--loglevel", "-l", type=LOGLEVEL, default="WARNING", show_default=True)
def up(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    data_dir: Path | None,
    calls_workers: int,
    verify_workers: int,
    concurrency: int,
    pool: str,
    metrics_port: int,
    no_metrics: bool,
    api: bool,
    api_host: str,
    api_port: int,
    example_provider: bool | None,
    events: bool,
    loglevel: str,
) -> None:
    """Run the whole local stack in the foreground until Ctrl-C or SIGTERM.

    Without --redis-url (or TOOLQ_REDIS_URL) an embedded Valkey is started with its data in
    --data-dir, so a restart keeps the ledger. The server URL and the app are recorded in
    --state-dir, where every other toolq command run in this directory finds them.
    """
    from toolq.edges.stack import Stack, StackConfig
    from toolq.examples.provider import InvoiceProvider

    _check_not_running(state_dir)
    _check_cluster(redis_url)
    app = app_path or DEFAULT_APP
    tq = load_app(app)  # a wrong --app fails here, once, before anything is started
    answers = _ping(redis_url) if redis_url else True
    if example_provider is None:
        example_provider = app == DEFAULT_APP and not os.environ.get("TOOLQ_EXAMPLE_PROVIDER_URL")
    notes: list[str] = []
    wanted: dict[str, tuple[int | None, str]] = {}
    if not no_metrics:
        if importlib.util.find_spec("toolq.edges.metrics") is None:
            notes.append("metrics    skipped: toolq.edges.metrics is not available")
        else:
            wanted["metrics"] = (metrics_port, "127.0.0.1")
    if api:
        if _api_available():
            wanted["api"] = (api_port, api_host)
        else:
            notes.append("api        skipped: `toolq api` is not available in this install")
    ports = _ports(wanted)
    metrics, api_port_used = ports.get("metrics"), ports.get("api")
    config = StackConfig(
        app=app,
        redis_url=redis_url,
        data_dir=None if redis_url else (data_dir or state_dir / "data"),
        calls_workers=calls_workers,
        verify_workers=verify_workers,
        concurrency=concurrency,
        pool=pool,
        loglevel=loglevel,
        events=events,
        metrics_port=metrics,
        api_port=api_port_used,
        api_host=api_host,
    )
    stack = Stack(config)
    provider = InvoiceProvider() if example_provider else None
    exit_code = 0
    with Interrupts(hurry=stack.kill_all):
        try:
            if provider is not None:
                provider.start()
                config.env["TOOLQ_EXAMPLE_PROVIDER_URL"] = provider.url
            try:
                stack.start()
            except Exception as exc:
                raise CliError(f"cannot start the stack: {type(exc).__name__}: {exc}") from None
            why = "(see the errors above)" if answers else "yet: it waits for the server"
            for name in stack.wait_serving():
                notes.append(f"{name:<10} not answering after 30 s {why}")
            recorded = {
                "redis_url": stack.redis_url,
                "app": app,
                **owner(),
                "metrics_url": stack.metrics_url,
                "api_url": stack.api_url,
                "embedded": stack.embedded,
                "started_at": time.time(),
                # What every other command here must share with the stack
                # (toolq.adapters.stack_state).
                "mode": mode_of(tq.settings),
            }
            supervisor = Supervisor(
                stack, lambda children: write_state({**recorded, "children": children}, state_dir)
            )
            supervisor.save()
            _print_banner(stack, app, state_dir, provider.url if provider else None, notes)
            exit_code = supervisor.run()
        except KeyboardInterrupt:
            click.echo("toolq up: stopping (Ctrl-C again to kill at once)…", err=True)
        finally:
            try:
                stack.stop()
                if provider is not None:
                    provider.stop()
            finally:
                clear_state(state_dir)
    if exit_code:
        sys.exit(exit_code)
    click.echo("toolq up: stopped", err=True)


def _print_banner(
    stack: Any, app: str, state_dir: Path, provider_url: str | None, notes: list[str]
) -> None:
    where = f"embedded Valkey, data in {stack.config.data_dir}" if stack.embedded else "external"
    lines = [f"toolq up: serving on {redact_url(stack.redis_url)} ({where})", f"  app        {app}"]
    for child in stack.children:
        lines.append(f"  {child.name:<10} pid {child.pid}")
    broker = stack.config.env.get("TOOLQ_BROKER_URL") or os.environ.get("TOOLQ_BROKER_URL")
    from toolq.topology.publish import publish_for

    publish = publish_for(broker)
    if publish.needs_relay:  # the relay above publishes to it
        lines.append(f"  broker     {publish.safe_broker} (through the ledger's outbox)")
    if stack.metrics_url:
        lines.append(f"  metrics    {stack.metrics_url}")
    if stack.api_url:
        lines.append(f"  api        {stack.api_url}")
        lines.append(f"  console    {stack.api_url}/ui/")
    if provider_url:
        lines.append(f"  provider   {provider_url} (example invoice service)")
    lines += [f"  {n}" for n in notes]
    lines += [
        f"  state      {state_dir}/state.json: toolq commands run here find this server",
        "Ctrl-C to stop.",
    ]
    click.echo("\n".join(lines))


COMMANDS = [up, demo]
