"""Operation commands: submit, show, approve, input, cancel, retry, verify, resolve."""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from toolq.core import why
from toolq.core.errors import OperationNotFound
from toolq.core.record import OperationRecord, ms_to_dt
from toolq.core.redact import shown_args
from toolq.core.states import SETTLED, State
from toolq.edges.cli.common import (
    Seconds,
    app_option,
    echo_json,
    handle_errors,
    open_app,
    open_ledger,
    parse_json_args,
    redis_option,
    state_dir_option,
)

if TYPE_CHECKING:
    from toolq.client.queue import ToolQueue
    from toolq.core.record import OperationRecord


def _common(f: Any) -> Any:
    return app_option(redis_option(state_dir_option(f)))


#: ``toolq submit --wait``'s exit status for the state the operation is in when it returns.
#: 2 (refused: bad input, unknown tool, no server) is every CliError's.
WAIT_EXIT: dict[State, int] = {
    State.SUCCEEDED: 0,
    State.FAILED: 1,
    State.ESCALATED: 1,
    State.CANCELLED: 1,
    State.AWAITING_APPROVAL: 4,
    State.NEEDS_INPUT: 4,
}
#: Any other state: still on its way (queued, running, waiting_retry, verifying).
WAIT_PENDING = 3
#: Ctrl-C while waiting: the shell's 128 + SIGINT, not a state's code.
WAIT_INTERRUPTED = 130


@click.command(
    epilog="""\b
Exit status with --wait:
  0  succeeded
  1  failed, escalated or cancelled (the envelope says why)
  2  refused or not submitted: bad input, unknown tool, server unreachable
  3  still pending when --wait ran out (queued, running, waiting_retry, verifying)
  4  waiting for a person: awaiting_approval (toolq approve) or needs_input (toolq input)
  130  interrupted (Ctrl-C) while waiting: the operation goes on
Without --wait: 0 once submitted, 2 if refused."""
)
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
    type=Seconds(0, 3600),
    default=None,
    help="Wait up to this many seconds, print the envelope, exit with the outcome (below).",
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
    """Submit a call to TOOL; prints its operation_ref (and on stderr, a warning when no
    live worker serves its queue or no scheduler runs: the call is submitted anyway)."""
    args = parse_json_args(args_json)
    tq = open_app(app_path, redis_url, state_dir)
    # Said below, once, on stderr: not a second time by the client's log line.
    logging.getLogger("toolq.liveness").disabled = True
    sub = tq.submit(tool, args, operation_ref=ref, call_id=call_id)
    click.echo(sub.operation_ref)
    for warning in sub.warnings:  # advisory: the operation is submitted all the same
        click.echo(f"warning: {warning}", err=True)
    if wait_s is None:
        return
    try:
        _wait_and_exit(tq, sub.operation_ref, wait_s)
    except KeyboardInterrupt:
        # Not click's "Aborted!" and exit 1: 1 says the operation failed, and it goes on.
        click.echo(f"{sub.operation_ref}: no longer waited for; it goes on", err=True)
        raise SystemExit(WAIT_INTERRUPTED) from None


def _wait_and_exit(tq: ToolQueue, ref: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` for ``ref``, print its envelope, exit with its state's code."""
    try:
        env = tq.wait(ref, timeout=wait_s)
    except TimeoutError:
        env = None  # nothing to show yet
    # The exit status and the envelope printed come from one read of the record.
    rec = tq.get(ref)
    if rec is None:
        raise OperationNotFound(f"operation {ref[:80]!r} is gone")
    if rec.state in SETTLED and rec.envelope is not None:
        env = rec.envelope
    if env is not None:
        click.echo(env.model_dump_json(indent=2, exclude_none=True))
    code = WAIT_EXIT.get(rec.state, WAIT_PENDING)
    if code == WAIT_PENDING:
        click.echo(f"{rec.operation_ref}: still {rec.state} after {wait_s:g} s", err=True)
    elif code:
        why = "" if env is None or env.ok else f" ({env.code})"
        click.echo(f"{rec.operation_ref}: {rec.state}{why}", err=True)
    if code:
        raise SystemExit(code)


@click.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print the record (with its state) as JSON.")
@_common
@handle_errors
def show(
    ref: str, as_json: bool, app_path: str | None, redis_url: str | None, state_dir: Path
) -> None:
    """Show an operation: its state and the timeline of its transitions.

    Without --json and --app (or TOOLQ_APP) the app is not imported: the record is read
    on a plain client (no tool is needed to show it). --json shows the arguments, and
    loads the app for the tool's input schema (a secret field is shown redacted)."""
    if not as_json and app_path is None:
        _show_text(_read_light(ref, redis_url, state_dir))
        return
    tq = open_app(app_path, redis_url, state_dir, publishes=False)
    rec = tq.get(ref)
    if rec is None:
        raise OperationNotFound(f"no operation {ref[:80]!r}")
    if as_json:
        # The arguments as every output shows them: never a secret they carry.
        schema = tq.registry.get(rec.tool).input_schema() if rec.tool in tq.registry else None
        shown = rec.model_dump(mode="json", by_alias=True)
        shown["args"] = shown_args(rec.args, schema)
        shown.update(why.explain(rec, int(time.time() * 1000)))
        echo_json(shown)
        return
    _show_text(rec)


def _read_light(ref: str, redis_url: str | None, state_dir: Path) -> OperationRecord:
    """The record of ``ref`` read without the app (:func:`open_ledger`)."""
    from toolq.adapters.ledger.replies import record_of

    topology, client = open_ledger(redis_url, state_dir)
    try:
        rec = record_of(client.hgetall(topology.layout.keys_of(ref).op(ref)))
    finally:
        client.close()
    if rec is None:
        raise OperationNotFound(f"no operation {ref[:80]!r}")
    return rec


def _show_text(rec: OperationRecord) -> None:
    click.echo(
        f"{rec.operation_ref}  {rec.tool}  {rec.state}  attempt {rec.attempt}/{rec.max_attempts}"
    )
    start = rec.history[0].at if rec.history else 0
    for i, h in enumerate(rec.history, 1):
        frm = h.from_ or "-"
        code = f"  {h.code}" if h.code else ""
        check = why.check_row(i, h)
        said = f"  [{_check_words(check)}]" if check is not None and h.note else ""
        click.echo(
            f"  +{(h.at - start) / 1000:8.3f}s  {frm:>17} -> {h.to:<17} #{h.attempt}  {h.by}"
            f"{code}{said}"
        )
    for line in _why_lines(rec, int(time.time() * 1000)):
        click.echo(line)
    if rec.envelope is not None:
        env = rec.envelope
        click.echo(
            f"envelope: ok={str(env.ok).lower()}"
            + ("" if env.ok else f" code={env.code} next_action={env.next_action}")
        )


def _check_words(c: why.CheckRow) -> str:
    detail = f" ({c.detail})" if c.detail and c.detail not in c.words else ""
    return f"check {c.check}: {c.words}{detail}"


def _clock(ms: int) -> str:
    return ms_to_dt(ms).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def _why_lines(rec: OperationRecord, now_ms: int) -> list[str]:
    """Why it waits, under the timeline: its verification, its retry, its escalation."""
    lines: list[str] = []
    v = why.verification(rec)
    if v is not None:
        line = f"verification: {v.checks_made} checks made, {v.failed} failed"
        if v.next_check_ms is not None:
            line += f"; next check at {_clock(v.next_check_ms)}"
        left = v.window_left_s(now_ms)
        if left is not None and rec.state is State.VERIFYING:
            line += f"; consistency window: {left:.0f} s left"
        lines.append(line)
    w = why.retry_wait(rec)
    if w is not None:
        details = "".join(f" {k}={v}" for k, v in sorted(w.safe_details.items()))
        nxt = f"; next retry at {_clock(w.not_before_ms)}" if w.not_before_ms else ""
        lines.append(
            f"last failure: {w.code}{details}; attempts: {w.attempts_used} used, "
            f"{w.attempts_left} left{nxt}"
        )
    e = why.escalation(rec)
    if e is not None:
        lines.append(f"escalated: {e.words}")
        lines.append(
            f"tried: {e.attempts_used} of {e.max_attempts} attempts, "
            f"{e.checks_made} verification checks ({e.checks_failed} failed)"
        )
    return lines


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
    click.echo(tq.provide_input(ref, args, by=_actor("input")))


def _operator_action(name: str, act: Callable[[ToolQueue], Callable[..., State]], doc: str) -> Any:
    """``toolq <name> REF``: ``act`` done to REF as this terminal's operator; prints the
    state it leaves the operation in."""

    @click.command(name=name, help=doc)
    @click.argument("ref")
    @_common
    @handle_errors
    def command(ref: str, app_path: str | None, redis_url: str | None, state_dir: Path) -> None:
        tq = open_app(app_path, redis_url, state_dir)
        click.echo(act(tq)(ref, by=_actor(name)))

    return command


approve = _operator_action(
    "approve",
    lambda tq: tq.approve,
    "Approve an operation awaiting approval (bound to its current arguments).",
)
cancel = _operator_action(
    "cancel",
    lambda tq: tq.cancel,
    "Cancel an operation that is queued or waiting (never one that may be writing).",
)
retry = _operator_action(
    "retry",
    lambda tq: tq.retry_now,
    "Retry an operation waiting to retry now, not at its time (same operation_ref; "
    "the attempt is counted, and one past the budget escalates instead).",
)
verify = _operator_action(
    "verify",
    lambda tq: tq.verify_now,
    "Check an operation whose outcome is being verified now, not at its next check.",
)


@click.command()
@click.argument("ref")
@click.option(
    "--committed",
    is_flag=True,
    help="You checked the provider: the write happened (give --result or --reference).",
)
@click.option(
    "--not-committed",
    is_flag=True,
    help="You checked the provider: nothing was written; the operation fails for good.",
)
@click.option(
    "--retry",
    is_flag=True,
    help="You checked the provider: nothing was written; run one attempt more, same ref.",
)
@click.option("--reason", required=True, help="What you checked (kept in the history).")
@click.option("--result", "result_json", metavar="JSON", help="The write's result (--committed).")
@click.option("--reference", default="", help="Where you saw it: the provider's id, a ticket.")
@click.option("--rev", default="", help="The revision you read (toolq show --json): refused if "
              "the operation moved on since.")  # fmt: skip
@_common
@handle_errors
def resolve(
    ref: str,
    committed: bool,
    not_committed: bool,
    retry: bool,
    reason: str,
    result_json: str | None,
    reference: str,
    rev: str,
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
) -> None:
    """Settle an escalated operation: --committed, --not-committed or --retry."""
    # Three flags, not one value: given two, the last one won without a word, and
    # `--committed --retry` ran a write again that the operator had seen happen.
    given = {"committed": committed, "not_committed": not_committed, "retry": retry}
    found = [outcome for outcome, flag in given.items() if flag]
    if len(found) != 1:
        say = "say what you found" if not found else "say one thing you found"
        raise click.UsageError(f"{say}: --committed, --not-committed or --retry")
    outcome = found[0]
    result = None if result_json is None else parse_json_args(result_json, "--result")
    tq = open_app(app_path, redis_url, state_dir)
    state = tq.resolve(
        ref,
        outcome,
        reason=reason,
        result=result,
        reference=reference,
        rev=rev,
        by=_actor("resolve"),
    )
    click.echo(state)


def _actor(action: str) -> str:
    """Who the history says acted: the operator's login name, from this terminal."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = ""
    name = "".join(c for c in user if c.isalnum() or c in "._-")[:32]
    return f"cli:{name}:{action}" if name else f"cli:{action}"


COMMANDS = [submit, show, approve, input_, cancel, retry, verify, resolve]
