"""Operation commands: submit, show, approve, input, cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from toolq.cli.common import (
    app_option,
    echo_json,
    handle_errors,
    open_app,
    parse_json_args,
    redis_option,
    state_dir_option,
)
from toolq.errors import OperationNotFound


def _common(f: Any) -> Any:
    return app_option(redis_option(state_dir_option(f)))


@click.command()
@click.argument("tool")
@click.option(
    "--args",
    "args_json",
    required=True,
    metavar="JSON",
    help='The arguments as a JSON object, e.g. \'{"customer": "c1"}\'.',
)
@click.option("--ref", default=None, help="The operation_ref (idempotency key); made if omitted.")
@click.option("--call-id", default=None, help="The agent framework's tool-call id.")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 3600),
    default=None,
    help="Wait up to this many seconds and print the envelope.",
)
@_common
@handle_errors
def submit(
    tool: str,
    args_json: str,
    ref: str | None,
    call_id: str | None,
    wait_s: float | None,
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
) -> None:
    """Submit a call to TOOL; prints its operation_ref."""
    args = parse_json_args(args_json)
    tq = open_app(app_path, redis_url, state_dir)
    sub = tq.submit(tool, args, operation_ref=ref, call_id=call_id)
    click.echo(sub.operation_ref)
    if wait_s is not None:
        try:
            env = tq.wait(sub.operation_ref, timeout=wait_s)
        except TimeoutError:
            click.echo(f"still pending after {wait_s:g} s", err=True)
            raise SystemExit(3) from None
        click.echo(env.model_dump_json(indent=2, exclude_none=True))


@click.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print the record (with its state) as JSON.")
@_common
@handle_errors
def show(
    ref: str, as_json: bool, app_path: str | None, redis_url: str | None, state_dir: Path
) -> None:
    """Show an operation: its state and the timeline of its transitions."""
    tq = open_app(app_path, redis_url, state_dir)
    rec = tq.get(ref)
    if rec is None:
        raise OperationNotFound(f"no operation {ref[:80]!r}")
    if as_json:
        echo_json(rec.model_dump(mode="json", by_alias=True))
        return
    click.echo(
        f"{rec.operation_ref}  {rec.tool}  {rec.state}  attempt {rec.attempt}/{rec.max_attempts}"
    )
    start = rec.history[0].at if rec.history else 0
    for h in rec.history:
        frm = h.from_ or "-"
        code = f"  {h.code}" if h.code else ""
        click.echo(
            f"  +{(h.at - start) / 1000:8.3f}s  {frm:>17} -> {h.to:<17} #{h.attempt}  {h.by}{code}"
        )
    if rec.envelope is not None:
        env = rec.envelope
        click.echo(
            f"envelope: ok={str(env.ok).lower()}"
            + ("" if env.ok else f" code={env.code} next_action={env.next_action}")
        )


@click.command()
@click.argument("ref")
@_common
@handle_errors
def approve(ref: str, app_path: str | None, redis_url: str | None, state_dir: Path) -> None:
    """Approve an operation awaiting approval (bound to its current arguments)."""
    tq = open_app(app_path, redis_url, state_dir)
    click.echo(tq.approve(ref))


@click.command(name="input")
@click.argument("ref")
@click.option(
    "--args",
    "args_json",
    required=True,
    metavar="JSON",
    help="The corrected arguments (identical ones are refused).",
)
@_common
@handle_errors
def input_(
    ref: str, args_json: str, app_path: str | None, redis_url: str | None, state_dir: Path
) -> None:
    """Give corrected arguments to an operation that needs input."""
    args = parse_json_args(args_json)
    tq = open_app(app_path, redis_url, state_dir)
    click.echo(tq.provide_input(ref, args))


@click.command()
@click.argument("ref")
@_common
@handle_errors
def cancel(ref: str, app_path: str | None, redis_url: str | None, state_dir: Path) -> None:
    """Cancel an operation that is queued or waiting (never one that may be writing)."""
    tq = open_app(app_path, redis_url, state_dir)
    click.echo(tq.cancel(ref))


COMMANDS = [submit, show, approve, input_, cancel]
