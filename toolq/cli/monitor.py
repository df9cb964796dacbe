"""``toolq status`` and ``toolq schema``: what is pending, and the contract."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import redis

from toolq.cli.common import (
    app_option,
    echo_json,
    handle_errors,
    open_app,
    redis_option,
    state_dir_option,
)
from toolq.monitor import STATES, status_snapshot


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
    type=click.FloatRange(0.1, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@click.option(
    "--workers/--no-workers",
    default=True,
    show_default=True,
    help="Ping Celery workers to count the live ones.",
)
@click.option(
    "--worker-timeout",
    type=click.FloatRange(0.05, 30),
    default=0.5,
    show_default=True,
    help="How long to wait for worker pings (seconds).",
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
    worker_timeout: float,
) -> None:
    """Operations per tool and state, oldest pending recovery, queues, scheduler, workers.

    Reads indexes only: fast whatever the size of the ledger.
    """

    tq = open_app(app_path, redis_url, state_dir)
    source = tq.settings.safe_url

    def show() -> None:
        snap = status_snapshot(tq, workers=workers, worker_timeout=worker_timeout)
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
    try:
        while True:
            try:
                show()
            except redis.RedisError as exc:  # keep watching through an outage
                click.echo(f"redis unavailable ({type(exc).__name__}); retrying", err=True)
            _pause(interval)
    except KeyboardInterrupt:
        pass


def _pause(seconds: float) -> None:
    time.sleep(seconds)


@click.command()
def schema() -> None:
    """Print the JSON Schema of the tool-result envelope."""
    from toolq.envelope import json_schema

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
    depth = "  ".join(f"{q} {n}" for q, n in queues["depth"].items())
    lines += ["", f"queues      {depth}  unacked {queues['unacked']}"]
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
    return "\n".join(lines)


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


def _workers(w: dict[str, Any]) -> str:
    if not w.get("checked"):
        return "not checked (--no-workers)"
    if w.get("live") is None:
        return f"unknown ({w.get('error', 'no answer')})"
    names = ", ".join(w.get("names", [])[:5])
    more = "" if len(w.get("names", [])) <= 5 else ", ..."
    return f"live {w['live']}" + (f"  ({names}{more})" if names else "")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        first = r[0].ljust(widths[0])
        rest = "  ".join(cell.rjust(w) for cell, w in zip(r[1:], widths[1:], strict=True))
        out.append(f"{first}  {rest}".rstrip())
    return out


COMMANDS = [status, schema]
