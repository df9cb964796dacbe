"""``toolq status``, ``toolq flower`` and ``toolq schema``: what is pending, Flower on
the deployment, and the contract."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import redis

from toolq.adapters.stack_state import read_state
from toolq.core.redact import redact_url
from toolq.edges.cli.common import (
    CLUSTER_AWAY,
    CliError,
    Seconds,
    app_option,
    check_meta,
    echo_json,
    handle_errors,
    ledger_client,
    open_app,
    redis_option,
    resolve_app_path,
    resolve_url,
    server_said,
    state_dir_option,
    unreachable_line,
)
from toolq.edges.deps_text import status_line
from toolq.edges.monitor import (
    STATES,
    broker_depths,
    read_status,
    settings_sources,
    status_snapshot,
)

#: What ``toolq status --watch`` keeps watching through: any Redis failure, a Cluster's too.
_REDIS_AWAY: tuple[type[Exception], ...] = (redis.RedisError, *CLUSTER_AWAY)
#: What a watch waits out: the server away, or a Cluster's node away, named (CliError).
_WATCH_AWAY: tuple[type[Exception], ...] = (*_REDIS_AWAY, CliError)


@click.command()
@app_option
@redis_option
@state_dir_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the snapshot as JSON (one line per refresh with --watch).",
)
@click.option("--watch", "-w", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    "-i",
    type=Seconds(0.1, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@click.option(
    "--workers/--no-workers",
    default=True,
    show_default=True,
    help="Show the workers (from their heartbeats in Redis).",
)
@click.option(
    "--ping",
    is_flag=True,
    help="Ask the workers with a Celery broadcast instead (loads the app; waits "
    "--worker-timeout for answers).",
)
@click.option(
    "--worker-timeout",
    type=Seconds(0.05, 30),
    default=0.5,
    show_default=True,
    help="How long --ping waits for answers (seconds).",
)
@handle_errors
def status(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    as_json: bool,
    watch: bool,
    interval: float,
    workers: bool,
    ping: bool,
    worker_timeout: float,
) -> None:
    """Operations per tool and state, oldest pending recovery, queues, scheduler, workers.

    Reads indexes and heartbeats only: fast whatever the size of the ledger. Without
    --app (or TOOLQ_APP) the app is not imported: the settings come from TOOLQ_*.
    """
    if app_path is None and not ping:
        snapshot, source, stack_url = _light(redis_url, state_dir, workers)
    else:
        tq = open_app(app_path, redis_url, state_dir, publishes=False)
        source = tq.settings.safe_url
        stack_url = tq.settings.url

        def snapshot() -> dict[str, Any]:
            return status_snapshot(tq, workers=workers, worker_timeout=worker_timeout, ping=ping)

    def show() -> None:
        snap = snapshot()
        stack = stack_children(state_dir, stack_url)
        if stack is not None:
            snap["stack"] = stack
        if as_json and watch:
            click.echo(json.dumps(snap, separators=(",", ":")))
        elif as_json:
            echo_json(snap)
        else:
            text = render_status(snap, source=source)
            if watch:
                click.clear()
                text += f"\n\nevery {interval:g}s, Ctrl-C to stop"
            click.echo(text)

    if not watch:
        show()
        return
    from toolq.process.waiting import CAP_S, Outage

    # Through an outage: one line when it starts, one when it ends (not one per refresh),
    # and tries spaced out as every process's are, never closer than the refresh.
    retry_s = max(interval, CAP_S)
    outage = Outage(f"the ledger's server at {source}", meanwhile=f"retrying every ≤ {retry_s:g} s")
    try:
        while True:
            delay = interval
            try:
                show()
                back = outage.answered(time.time())
                if back is not None:
                    click.echo(back, err=True)
            except _WATCH_AWAY as exc:
                named = exc.message if isinstance(exc, CliError) else None
                wait_s, line = outage.failed(time.time(), type(exc).__name__)
                if line is not None:
                    click.echo(f"{named}; {outage.meanwhile}" if named else line, err=True)
                delay = max(interval, wait_s)
            _pause(delay)
    except KeyboardInterrupt:
        pass


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _light(
    redis_url: str | None, state_dir: Path, workers: bool
) -> tuple[Callable[[], dict[str, Any]], str, str]:
    """The snapshot read with the settings from the environment, on a plain client:
    no app, no Celery imported (what keeps ``toolq status`` under 0.3 s)."""
    settings, topology, client, url = ledger_client(redis_url, state_dir)
    try:
        client.ping()
        check_meta(topology, client)
    except redis.RedisError as exc:
        away = " (the ledger's server: toolq's processes wait for it and resume once it answers)"
        raise CliError(server_said(url, exc, away)) from None
    sources = settings_sources(settings)
    depths = broker_depths(settings)
    seen: frozenset[str] = frozenset()

    def snapshot() -> dict[str, Any]:
        nonlocal seen
        now = int(time.time() * 1000)
        try:
            snap = read_status(
                client, sources, now_ms=now, tools_hint=seen, beats=workers, broker_depths=depths
            )
        except CLUSTER_AWAY as exc:  # a node away mid-read: name it
            line = unreachable_line(url, exc, cluster=True)
            if line is None:
                raise
            raise CliError(line) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not topology.on_cluster:
                raise
            raise CliError(unreachable_line(url, exc, cluster=True) or str(exc)) from None
        seen = frozenset(snap["tools"])  # the next refresh needs one round trip
        return snap

    return snapshot, redact_url(url), url


@click.command(context_settings={"ignore_unknown_options": True})
@app_option
@redis_option
@state_dir_option
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Where Flower listens. It has no authentication of its own unless given one "
    "(--basic-auth=user:password, ...): keep it on loopback otherwise.",
)
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def flower(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    port: int,
    address: str,
    flower_args: tuple[str, ...],
) -> None:
    """Start Flower on this deployment (more arguments go to Flower).

    \b
    What it runs, on any machine with the app importable:
      TOOLQ_APP=MODULE:ATTR TOOLQ_REDIS_URL=URL \\
        celery -A toolq.celery_app:celery_app flower --address=127.0.0.1
    Flower shows tasks only from workers that send events: `toolq worker -E`.
    """
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("flower") is None:
        raise CliError("Flower is not installed here: pip install flower")
    env = dict(os.environ, TOOLQ_APP=resolve_app_path(app_path, state_dir))
    url = resolve_url(redis_url, state_dir)
    if url:
        env["TOOLQ_REDIS_URL"] = url
    argv = [sys.executable, "-m", "celery", "-A", CELERY_APP, "flower"]
    argv += [f"--port={port}", f"--address={address}", *flower_args]
    sys.stdout.flush()
    # Flower becomes this process (its pid, its signals): no supervisor in between.
    os.execve(sys.executable, argv, env)  # noqa: S606 - a fixed program, no shell


#: The Celery app Flower and ``celery inspect`` are given (:mod:`toolq.edges.celery_app`).
CELERY_APP = "toolq.celery_app:celery_app"


@click.command()
def schema() -> None:
    """Print the JSON Schema of the tool-result envelope."""
    from toolq.core.envelope import json_schema

    echo_json(json_schema())


# --------------------------------------------------------------------------- the table

_HEADERS = {
    "queued": "QUEUED", "running": "RUNNING", "waiting_retry": "RETRY", "verifying": "VERIFY",
    "awaiting_approval": "APPROVAL", "needs_input": "INPUT", "succeeded": "OK",
    "failed": "FAILED", "escalated": "ESCALATED", "cancelled": "CANCELLED",
}  # fmt: skip


def render_status(snap: dict[str, Any], *, source: str = "") -> str:
    """The snapshot as the table ``toolq status`` prints.

    Cells of unfinished states read ``count (age of the oldest)``.
    """
    lines = [f"toolq status  {snap['at']}  {source}".rstrip(), ""]
    tools: dict[str, Any] = snap["tools"]
    rows: list[Sequence[str]] = [["TOOL", *(_HEADERS.get(s, s.upper()) for s in STATES)]]
    for name, t in tools.items():
        rows.append([name, *(_cell(t["states"][s], t["oldest"].get(s)) for s in STATES)])
    if len(tools) > 1:
        tot = snap["totals"]
        rows.append(["(all)", *(_cell(tot["states"][s], tot["oldest"].get(s))
                                for s in STATES)])  # fmt: skip
    lines += _table(rows) if tools else ["no operations in the ledger"]
    if tools:
        lines += ["", *_table(_counter_rows(tools))]
    queues, sched, workers = snap["queues"], snap["scheduler"], snap.get("workers", {})
    depth = "  ".join(f"{q} {n}" for q, n in queues["depth"].items()) or "(broker not read)"
    unacked = "" if queues["unacked"] is None else f"  unacked {queues['unacked']}"
    lines += ["", f"queues      {depth}{unacked}"]
    box = snap.get("outbox")
    if box is not None:
        oldest = box["oldest_age_ms"]
        lag = box["lag_ms"]
        lines.append(
            f"outbox      {box['entries']} waiting  oldest "
            + ("-" if oldest is None else _age(oldest / 1000))
            + f"  relays live {box['relays']}  lag "
            + ("-" if lag is None else f"{lag} ms")
            + ("  (no relay live: nothing is published)" if not box["relays"] else "")
        )
    if queues.get("workers"):
        lines.append(f"heartbeats  {_beats(queues['workers'])}")
    nxt = sched["next_due_in_s"]
    when = "-" if nxt is None else ("now" if nxt <= 0 else f"in {_age(nxt)}")
    lines.append(
        f"scheduler   backlog {sched['backlog']}  due now {sched['due_now']}  next {when}  "
        f"live {sched['live']}/{len(sched['instances'])}"
        + ("  (none live: nothing due will move)" if not sched["live"] and sched["backlog"] else "")
    )
    lines.append(f"workers     {_workers(workers)}")
    if snap.get("rates"):
        lines.append(f"per minute  {_rates(snap['rates'])}")
    lines += [_waiting(w) for w in snap.get("waiting", ())]
    if snap.get("deps"):
        now_ms = int(snap.get("now_ms") or time.time() * 1000)
        lines += [f"dependency  {status_line(d, now_ms)}" for d in snap["deps"]]
    if snap.get("stack"):
        lines += ["", *_stack_lines(snap["stack"], snap.get("at"))]
    return "\n".join(lines)


def stack_children(state_dir: Path, url: str) -> dict[str, Any] | None:
    """The children of the ``toolq up`` recorded in ``state_dir`` on this server, with
    their restarts (what its supervisor records); None when it runs none here."""
    data = read_state(state_dir)
    if not data or data.get("redis_url") != url or not isinstance(data.get("children"), dict):
        return None
    return {"pid": data.get("pid"), "children": data["children"]}


def _stack_lines(stack: dict[str, Any], at: object) -> list[str]:
    """One line per child of ``toolq up``: its state, pid and restarts."""
    now = time.time()
    lines = [f"toolq up    pid {stack.get('pid')}"]
    for name, c in stack["children"].items():
        state = str(c.get("state", "?"))
        line = f"  {name:<10} {state:<10} pid {c.get('pid')}  restarts {c.get('restarts', 0)}"
        exit_at = c.get("last_exit_at")
        if isinstance(exit_at, (int, float)):
            line += f"  (last exit code {c.get('last_exit_code')}, {_age(now - exit_at)} ago)"
        if state == "failed":
            line += "  crash loop: not restarted"
        lines.append(line)
    return lines


#: How ``toolq status`` names what a process waits for (a beat's ``waiting.for``).
_DEPENDENCIES = {"broker": "the broker", "ledger": "the ledger's server"}


def _waiting(w: dict[str, Any]) -> str:
    """``relay r1: waiting for the broker since 21:04:05 (40s)`` (UTC)."""
    since = datetime.fromtimestamp(w["since_ms"] / 1000, UTC).strftime("%H:%M:%S")
    what = _DEPENDENCIES.get(w["for"], w["for"])
    return f"{w['who']}: waiting for {what} since {since} UTC ({_age(w['age_s'])})"


def _counter_rows(tools: dict[str, Any]) -> list[Sequence[str]]:
    rows: list[Sequence[str]] = [
        ["TOOL", "SUBMITTED", "ATTEMPTS", "UNKNOWN", "VERIFIED FOUND/NOT/ESC",
         "DUPLICATES PREVENTED", "ESCALATIONS"],
    ]  # fmt: skip
    for name, t in tools.items():
        c = t["counters"]
        verified = f"{c['verify_found']}/{c['verify_not_found']}/{c['verify_escalated']}"
        rows.append([name, str(c["submitted"]), str(c["attempts"]), str(c["unknown"]), verified,
                     str(c["duplicates_prevented"]), str(c["escalated"])])  # fmt: skip
    return rows


def _cell(count: int, oldest: dict[str, Any] | None) -> str:
    if count and oldest is not None:
        return f"{count} ({_age(oldest['age_s'])})"
    return str(count)


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _beats(per_queue: dict[str, Any]) -> str:
    """Each queue's last worker heartbeat; "no live worker" where none is recent."""
    cells = []
    for queue, b in per_queue.items():
        if b["alive"]:
            cells.append(f"{queue} {_age(b['age_s'])} ago")
        elif b["age_s"] is None:
            cells.append(f"{queue} no live worker (never seen)")
        else:
            cells.append(f"{queue} no live worker (last {_age(b['age_s'])} ago)")
    return "  ".join(cells)


def _rates(r: dict[str, Any]) -> str:
    """Submitted and succeeded a minute, over 5 and 60 minutes (count / window)."""
    if r["last_60m"].get("submitted") is None:
        return "- (no samples: no scheduler has run)"
    return "  ".join(
        f"last {label}: submitted {r[key]['submitted']:g}, succeeded {r[key]['succeeded']:g}"
        for label, key in (("5 min", "last_5m"), ("60 min", "last_60m"))
    )


def _workers(w: dict[str, Any]) -> str:
    if not w.get("checked"):
        return "not checked (--no-workers)"
    if w.get("live") is None:
        return f"unknown ({w.get('error', 'no answer')})"
    names = ", ".join(w.get("names", [])[:5])
    more = "" if len(w.get("names", [])) <= 5 else ", ..."
    text = f"live {w['live']}" + (f"  ({names}{more})" if names else "")
    gone = w.get("gone") or [n for n in w.get("nodes", ()) if not n["alive"]]
    if gone:  # stopped beating without saying goodbye (killed, or cut off)
        latest = min(n["age_s"] for n in gone)
        text += f"  gone {len(gone)} (the latest beat {_age(latest)} ago)"
    return text


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        first = r[0].ljust(widths[0])
        rest = "  ".join(cell.rjust(w) for cell, w in zip(r[1:], widths[1:], strict=True))
        out.append(f"{first}  {rest}".rstrip())
    return out


COMMANDS = [status, schema, flower]
