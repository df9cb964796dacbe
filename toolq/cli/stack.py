"""``toolq up`` (the whole local stack, in the foreground) and ``toolq demo``."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from toolq.cli.common import (
    DEFAULT_APP,
    CliError,
    app_option,
    load_app,
    redis_option,
    state_dir_option,
)
from toolq.errors import ToolqError
from toolq.redact import redact_url
from toolq.state import clear_state, mode_of, owner, read_state, write_state
from toolq.supervise import Action, ChildRecord, RestartPolicy


class _Interrupts:
    """The first SIGINT or SIGTERM raises KeyboardInterrupt (so ``finally`` stops the stack);
    a later one, while stopping, calls ``hurry`` instead of cutting the stop short."""

    def __init__(self, hurry: Callable[[], None] | None = None) -> None:
        self.hurry = hurry
        self.fired = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        if self.hurry is not None:
            self.hurry()

    def __enter__(self) -> _Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _port(value: int | None, what: str, host: str = "127.0.0.1") -> int | None:
    """0 picks a free port; None stays off; a port in use is refused now, in one line."""
    from toolq.stack import free_port

    if value == 0:
        return free_port()
    if value is not None and not _bindable(host, value):
        raise CliError(
            f"port {value} for {what} is in use: pass --{what}-port 0 (any free port) "
            "or another port"
        )
    return value


def _bindable(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now. With SO_REUSEADDR, as uvicorn
    and the metrics server bind theirs: the TIME_WAIT connections a crash (or a browser
    tab) leaves on the port do not count, a socket listening there still does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _api_available() -> bool:
    """The HTTP API is the ``api`` extra: served only when FastAPI and uvicorn are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))


def _ping(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        raise CliError(f"cannot reach Redis at {redact_url(url)}: {type(exc).__name__}") from None
    finally:
        client.close()


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
@click.option("--loglevel", "-l", default="WARNING", show_default=True)
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
    from toolq.examples.provider import InvoiceProvider
    from toolq.stack import Stack, StackConfig

    _check_not_running(state_dir)
    _check_cluster(redis_url)
    app = app_path or DEFAULT_APP
    tq = load_app(app)  # a wrong --app fails here, once, before anything is started
    if redis_url:
        _ping(redis_url)
    if example_provider is None:
        example_provider = app == DEFAULT_APP and not os.environ.get("TOOLQ_EXAMPLE_PROVIDER_URL")
    notes: list[str] = []
    metrics: int | None = None
    if not no_metrics:
        if importlib.util.find_spec("toolq.metrics") is None:
            notes.append("metrics    skipped: toolq.metrics is not available")
        else:
            metrics = _port(metrics_port, "metrics")
    api_port_used: int | None = None
    if api:
        if _api_available():
            api_port_used = _port(api_port, "api", api_host)
        else:
            notes.append("api        skipped: `toolq api` is not available in this install")
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
    with _Interrupts(hurry=stack.kill_all):
        try:
            if provider is not None:
                provider.start()
                config.env["TOOLQ_EXAMPLE_PROVIDER_URL"] = provider.url
            try:
                stack.start()
            except Exception as exc:
                raise CliError(f"cannot start the stack: {type(exc).__name__}: {exc}") from None
            for name in stack.wait_serving():
                notes.append(f"{name:<10} not answering after 30 s (see the errors above)")
            recorded = {
                "redis_url": stack.redis_url,
                "app": app,
                **owner(),
                "metrics_url": stack.metrics_url,
                "api_url": stack.api_url,
                "embedded": stack.embedded,
                "started_at": time.time(),
                # What every other command here must share with the stack (toolq.state).
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


class Supervisor:
    """Restart each child of ``stack`` that exits, as :class:`RestartPolicy` decides, and
    give up on one in a crash loop while the rest keeps serving. ``save`` is handed each
    child's record (:class:`ChildRecord`) after every change: ``toolq status`` reads them
    from the state file."""

    def __init__(
        self,
        stack: Any,
        save: Callable[[dict[str, Any]], object],
        policy: RestartPolicy | None = None,
        poll: float = 0.2,
    ) -> None:
        self.stack = stack
        self.policy = policy or RestartPolicy()
        self.poll = poll
        self._save = save
        self.records = {c.name: ChildRecord(c.name, c.pid) for c in stack.supervised()}
        self._due: dict[str, float] = {}  # child name -> when to start it again

    def save(self) -> None:
        self._save({name: r.as_json() for name, r in self.records.items()})

    def run(self) -> int:
        """Until interrupted (KeyboardInterrupt); 1 when every child has failed."""
        while True:
            if self.step(time.monotonic()):
                self.save()
            if all(r.state == "failed" for r in self.records.values()):
                click.echo("toolq up: every process has failed; stopping", err=True)
                return 1
            time.sleep(self.poll)

    def step(self, now: float) -> bool:
        """Look at every child once; whether a record changed."""
        changed = False
        for child in self.stack.supervised():
            rec = self.records[child.name]
            if rec.state == "running" and child.popen is not None and not child.running:
                self._exited(child, rec, now)
                changed = True
            elif rec.state == "restarting" and now >= self._due[child.name]:
                rec.restarts += 1
                rec.state = "running"
                changed = True
                try:
                    rec.pid = self.stack.restart(child)
                except (OSError, ToolqError) as exc:  # no fork, no log file, no PING:
                    why = getattr(exc, "strerror", None) or exc  # an exit like any other
                    click.echo(
                        f"toolq up: cannot start {child.name} again ({type(exc).__name__}: {why})",
                        err=True,
                    )
                    self._exited(child, rec, now)
        return changed

    def _exited(self, child: Any, rec: ChildRecord, now: float) -> None:
        code = child.popen.returncode
        rec.exited(code, now, time.time())
        decision = self.policy.decide(rec.exits, now)
        if decision.action is Action.GIVE_UP:
            rec.state = "failed"
            self.stack.reap(child)  # what is left of its process group
            click.echo(
                f"toolq up: {child.name} exited (code {code}), {decision.recent} times in "
                f"{self.policy.window:g} s; not restarting it again (see its errors above); "
                "the rest keeps serving",
                err=True,
            )
            return
        rec.state = "restarting"
        self._due[child.name] = now + decision.delay
        click.echo(
            f"toolq up: {child.name} exited (code {code}); restarting in "
            f"{decision.delay:g} s (restart {rec.restarts + 1})",
            err=True,
        )


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


@click.command()
@click.option(
    "--ops",
    type=click.IntRange(10, 5000),
    default=60,
    show_default=True,
    help="Workload size (operations the agent starts).",
)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--timeout",
    type=click.FloatRange(10, 3600),
    default=180.0,
    show_default=True,
    help="Give up (and fail) after this many seconds.",
)
@click.option("--calls-workers", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option(
    "--provider-dedup/--no-provider-dedup",
    default=True,
    show_default=True,
    help="Whether the provider deduplicates by Idempotency-Key. Off, only toolq "
    "stands between a retry and a duplicate write.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def demo(
    ops: int,
    seed: int,
    timeout: float,
    calls_workers: int,
    provider_dedup: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run the real stack against a provider that misbehaves on purpose, and report.

    Embedded Valkey, the scheduler, calls workers and a verify worker; validation errors,
    rate limits, conflicts, approvals, lost replies, timeouts before commit, and a worker
    SIGKILLed mid-write. Exits non-zero unless every succeeded write has exactly one side
    effect at the provider and every operation finished.
    """
    from toolq.demo import DemoOptions, run_demo

    opts = DemoOptions(
        ops=ops,
        seed=seed,
        timeout=timeout,
        calls_workers=calls_workers,
        provider_dedup=provider_dedup,
        progress=not quiet,
    )
    with _Interrupts():
        try:
            report = run_demo(opts)
        except KeyboardInterrupt:
            click.echo("toolq demo: interrupted; everything it started is stopped", err=True)
            sys.exit(130)
        except Exception as exc:
            raise CliError(f"demo failed: {type(exc).__name__}: {exc}", exit_code=1) from None
    click.echo(json.dumps(report, indent=2) if as_json else render_report(report))
    if not report["ok"]:
        sys.exit(1)


def render_report(r: dict[str, Any]) -> str:
    """The demo's report as text (``--json`` prints the dict itself)."""
    u, d, s, p = (
        r["unknowns"],
        r["duplicates_prevented"],
        r["side_effects"],
        r["pending_recovery_s"],
    )
    lines = [
        f"toolq demo: {r['operations']} operations in {r.get('duration_s', 0):.1f} s",
        "",
        "Operations by final state",
    ]
    for state, n in r["by_state"].items():
        tools = ", ".join(
            f"{k.split('|')[0]} {v}"
            for k, v in r["by_tool_state"].items()
            if k.endswith(f"|{state}")
        )
        lines.append(f"  {state:<18} {n:>4}   ({tools})")
    causes = ", ".join(f"{k} {v}" for k, v in sorted(u["causes"].items())) or "none"
    lines += [
        "",
        "Unknown outcomes resolved by verification",
        f"  operations verified      {u['operations_verified']:>4}   (why: {causes})",
        f"  found committed          {u['found_committed']:>4}   -> succeeded, nothing re-sent",
        f"  not found after window   {u['not_found_redispatched']:>4}   "
        "-> re-dispatched with the same operation_ref",
        f"  escalated                {u['escalated']:>4}",
        "",
        "Duplicate writes prevented",
        f"  deliveries refused by the ledger claim    {d['ledger_refused_deliveries']:>4}   "
        f"({r['agent_actions'].get('redeliveries_injected', 0)} redelivered on purpose)",
        f"  repeats the provider had to deduplicate   {d['provider_replays']:>4}",
        "",
        "Side effects per operation_ref (the provider's own records)",
        f"  succeeded writes {s['succeeded_writes']}, with exactly one side effect "
        f"{s['exactly_one']}; side effects in all {s['total']}",
    ]
    lines += [
        f"  VIOLATION {v['operation_ref']}: {v['state']} with {v['side_effects']} side effect(s)"
        for v in s["violations"]
    ]
    lines += [
        "",
        f"Time in pending recovery ({p['operations']} operations)",
        f"  p50 {p['p50']:.2f} s   p95 {p['p95']:.2f} s   max {p['max']:.2f} s",
        "",
        "Escalations per tool",
    ]
    lines += [f"  {t:<18} {n:>4}" for t, n in sorted(r["escalations"].items())] or ["  none"]
    k = r.get("worker_killed") or {}
    if k:
        lines += [
            "",
            f"Worker killed mid-write: {k['worker']} (pid {k['pid']}) at {k['at_s']} s "
            f"during {k['ref']}: {k.get('final_state', '?')} via lease sweep and verification",
        ]
    if r["unfinished"]:
        lines += ["", f"UNFINISHED operations: {', '.join(r['unfinished'][:10])}"]
    lines += ["", "RESULT: " + ("OK" if r["ok"] else "FAILED")]
    return "\n".join(lines)


COMMANDS = [up, demo]
