"""``toolq cells``: the ledger's cells (issue 18, docs/cells.md)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click
import redis

from toolq.core.cells import MAX_CELLS
from toolq.core.redact import redact_url
from toolq.edges.cli.common import (
    CliError,
    handle_errors,
    prefix_option,
    redis_option,
    resolve_url,
    state_dir_option,
)

if TYPE_CHECKING:
    from toolq.adapters.ledger.spread import Move


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
@prefix_option
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

    from toolq.adapters.ledger.migrate import to_cells

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


def _connect(redis_url: str | None, state_dir: str) -> tuple[str, redis.Redis]:
    from pathlib import Path

    url = resolve_url(redis_url, Path(state_dir))
    if url is None:
        raise CliError("no Redis URL: pass --redis-url or set TOOLQ_REDIS_URL")
    from toolq.core.settings import seed_urls

    # a Cluster's seeds (redis://a:7000,b:7001): the first one's node
    return url, redis.Redis.from_url(seed_urls(url)[0], socket_timeout=30)


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not host:port")
    return value


@cells.command()
@redis_option
@state_dir_option
@click.option(
    "--node",
    "joining",
    multiple=True,
    required=True,
    callback=lambda _ctx, _param, values: [_address(v) for v in values],
    help="host:port of an empty Cluster node to join as a primary (repeat the option).",
)
@handle_errors
def adopt(redis_url: str | None, state_dir: str, joining: list[str]) -> None:
    """Make a converted server a Cluster: it serves every slot, empty primaries join.

    Run on the single server restarted with `cluster-enabled yes` (it claims the
    slots its keys are in): it assigns itself the slots no node serves (CLUSTER
    ADDSLOTSRANGE), meets each --node (CLUSTER MEET; each must be an empty
    Cluster node) and waits for cluster_state:ok. Then `toolq cells balance`.
    """
    from toolq.adapters.ledger.spread import Nodes, adopt

    url, client = _connect(redis_url, state_dir)
    nodes = Nodes(client)
    try:
        adopt(client, nodes, joining, progress=click.echo)
    finally:
        nodes.close()
        client.close()
    click.echo(f"{redact_url(url)}: a Cluster of {1 + len(joining)} primaries, cluster_state:ok")


@cells.command()
@redis_option
@state_dir_option
@prefix_option
@click.option("--dry-run", is_flag=True, help="Print the plan; move nothing.")
@handle_errors
def balance(redis_url: str | None, state_dir: str, prefix: str, dry_run: bool) -> None:
    """Spread the ledger's cells evenly over the Cluster's primaries.

    Reads the number of cells from the ledger's meta and the Cluster's slot map,
    and moves the cells' slots (CLUSTER MIGRATESLOTS, Valkey 9's atomic slot
    migration; processes may keep running) so that each primary serves as even a
    share of the cells as it can, moving as few slots as it can. Slots without a
    cell stay where they are.
    """
    from toolq.adapters.ledger.spread import Nodes, balance, plan_for

    _, client = _connect(redis_url, state_dir)
    nodes = Nodes(client)
    try:
        made = plan_for(client, nodes, prefix)
        name = made.addresses
        click.echo(f"{made.cells} cells of {prefix!r} on {len(made.before)} primaries:")
        for node, count in made.before.items():
            click.echo(f"  {name[node]}: {count} -> {made.after[node]} cells")
        if not made.moves:
            click.echo("balanced already: nothing to move")
            return
        click.echo(f"{len(made.moves)} slots to move")
        if dry_run:
            for m in made.moves:
                click.echo(
                    f"  slot {m.slot} ({m.cells} cell{'s' if m.cells > 1 else ''}): "
                    f"{name[m.source]} -> {name[m.target]}"
                )
            return

        def shown(done: int, total: int, batch: list[Move]) -> None:
            click.echo(
                f"  moved {done}/{total} slots ({len(batch)} {name[batch[0].source]} -> "
                f"{name[batch[0].target]})"
            )

        balance(nodes, made, shown)
    finally:
        nodes.close()
        client.close()
    click.echo("balanced")


COMMANDS = [cells]
