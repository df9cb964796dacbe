"""``toolq migrate``: bring a ledger stored by an earlier toolq to today's format."""

from __future__ import annotations

import click
import redis

from toolq.core.redact import redact_url
from toolq.edges.cli.common import (
    CliError,
    handle_errors,
    prefix_option,
    redis_option,
    state_dir_option,
)


@click.command()
@redis_option
@state_dir_option
@prefix_option
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option(
    "--force",
    is_flag=True,
    help="Migrate even though a worker, scheduler or relay beat in the last 15 s.",
)
@handle_errors
def migrate(redis_url: str | None, state_dir: str, prefix: str, dry_run: bool, force: bool) -> None:
    """Bring a ledger written by an earlier toolq to this toolq's format.

    \b
    A process that meets a ledger in an earlier format refuses it (LEDGER_FORMAT)
    and names this command. Stop every worker, scheduler and relay of the ledger
    (it refuses while one beats, unless --force), then run it once: it renames the
    keys of format 1 to their tagged names and folds each history list into its
    record (format 2), reporting progress, and records the format last. Records,
    their histories and states, the due set, the indexes and the counters are kept;
    queued operations run once the workers are back. Safe to run again: an
    interrupted run is finished by the next, and a ledger already in today's
    format is left as it is.

    \b
    Examples:
      toolq migrate --dry-run   what would change (nothing is changed)
      toolq migrate             migrate (after stopping every process)

    \b
    Formats: 1 keys without a hash tag (toolq:op:<ref>), 2 tagged keys with a
    history list per operation, 3 (today) history in the record.
    """
    from pathlib import Path

    from toolq.adapters.ledger.upgrade import migrate as run
    from toolq.decisions.formats import DESCRIPTIONS, FORMAT
    from toolq.edges.cli.common import resolve_url

    url = resolve_url(redis_url, Path(state_dir))
    if url is None:
        raise CliError("no Redis URL: pass --redis-url or set TOOLQ_REDIS_URL")
    client = redis.Redis.from_url(url, socket_timeout=60)
    where = redact_url(url)
    try:
        click.echo(f"{where}: ledger {prefix!r}")
        done = run(client, prefix, dry_run=dry_run, force=force, progress=click.echo)
    finally:
        client.close()
    found = f"format {done.found} ({DESCRIPTIONS[done.found]})"
    if done.already:
        click.echo(f"in {found} already: nothing to do")
        return
    verb = "would be" if dry_run else "is now"
    click.echo(f"was in {found}; {verb} in format {FORMAT} ({DESCRIPTIONS[FORMAT]})")
    if dry_run:
        click.echo("dry run: nothing was changed")


COMMANDS = [migrate]
