"""``toolq list``: a page of operations, in one state or all, searched by a part of a
ref or of a tool's name (what the console's list pages and ``GET /v1/operations`` show)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from toolq.core.states import TERMINAL, State
from toolq.edges.cli.common import (
    app_option,
    echo_json,
    handle_errors,
    open_app,
    redis_option,
    state_dir_option,
)


@click.command(name="list")
@click.option(
    "--state",
    type=click.Choice([s.value for s in State]),
    default=None,
    help="One state; every state without it.",
)
@click.option("--find", "search", default=None, help="A part of a ref, or of a tool's name.")
@click.option("--tool", default=None, help="Only this tool's operations.")
@click.option("--newest", is_flag=True, help="Newest first (by when each entered its state).")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", default=None, help="A page's next (or previous) cursor, to go on.")
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON.")
@app_option
@redis_option
@state_dir_option
@handle_errors
def list_(
    state: str | None,
    search: str | None,
    tool: str | None,
    newest: bool,
    limit: int,
    cursor: str | None,
    as_json: bool,
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
) -> None:
    """List operations a page at a time: ref, tool, state, attempt, duration."""
    tq = open_app(app_path, redis_url, state_dir, publishes=False)
    page = tq.list_operations(
        state, search=search, tool=tool, newest_first=newest, limit=limit, cursor=cursor
    )
    if as_json:
        echo_json(page.model_dump(mode="json"))
        return
    now_ms = int(time.time() * 1000)
    for row in page.items:
        took = row.duration_ms(now_ms)
        shown = "-" if took is None else f"{took / 1000:.1f}s"
        so_far = "" if took is None or row.state in TERMINAL else " so far"
        click.echo(
            f"{row.operation_ref}  {row.tool}  {row.state}  "
            f"attempt {row.attempt}/{row.max_attempts}  {shown}{so_far}"
        )
    _footer(page.model_dump())


def _footer(page: dict[str, Any]) -> None:
    n = len(page["items"])
    total = "" if page["total"] is None else f" of {page['total']}"
    partial = " (stopped early: more may match after the next cursor)" if page["partial"] else ""
    click.echo(f"{n}{total} on this page{partial}")
    if page["next_cursor"]:
        click.echo(f"next:     --cursor {page['next_cursor']}")
    if page["prev_cursor"]:
        click.echo(f"previous: --cursor {page['prev_cursor']}")


COMMANDS = [list_]
