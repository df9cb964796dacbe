"""``toolq cells``: the ledger's cells (issue 18, docs/cells.md)."""

from __future__ import annotations

import time

import click
import redis

from toolq.cells import MAX_CELLS
from toolq.cli.common import CliError, handle_errors, redis_option, resolve_url, state_dir_option
from toolq.redact import redact_url


@click.group()
def cells() -> None:
    """The ledger's cells: what a Valkey Cluster spreads over its nodes."""


@cells.command()
@redis_option
@state_dir_option
@click.option(
    "--cells",
    "count",
    type=click.IntRange(1, MAX_CELLS),
    required=True,
    help="How many cells (fixed for the ledger's life; then run with TOOLQ_CELLS=N).",
)
@click.option(
    "--prefix",
    envvar="TOOLQ_PREFIX",
    default="toolq",
    show_default=True,
    help="The ledger's key prefix (env TOOLQ_PREFIX).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Move even though a worker, scheduler or relay beat in the last 15 s.",
)
@handle_errors
def migrate(redis_url: str | None, state_dir: str, count: int, prefix: str, force: bool) -> None:
    """Move a single-server ledger into cells (every writer stopped).

    Records, due set and indexes go to their refs' cells, counters and tools to
    cell 0; the number of cells is recorded last. Run again after an interruption.
    """
    from pathlib import Path

    from toolq.ledger.migrate import to_cells

    url = resolve_url(redis_url, Path(state_dir))
    if url is None:
        raise CliError("no Redis URL: pass --redis-url or set TOOLQ_REDIS_URL")
    client = redis.Redis.from_url(url)
    try:
        moved = to_cells(client, prefix, count, int(time.time() * 1000), force=force)
    finally:
        client.close()
    where = redact_url(url)
    if moved.already:
        click.echo(f"{where}: the ledger {prefix!r} is in {count} cells already")
        return
    click.echo(
        f"{where}: moved {moved.records} records, {moved.due} due entries and "
        f"{moved.indexed} index entries ({moved.indexes} indexes) into {count} cells; "
        f"{moved.counters} counters and {moved.tools} tools into cell 0. "
        f"Run every process with TOOLQ_CELLS={count}."
    )


COMMANDS = [cells]
