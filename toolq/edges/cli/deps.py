"""``toolq deps``: the dependency keys, and settling one (lift a pause, close a breaker).

Reads and writes the ledger on a plain client, without importing the app (nor Celery),
as ``toolq show`` does (:func:`toolq.edges.cli.common.open_ledger`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from toolq.adapters.ledger.dep_state import DepActed, DepDetail, DepState
from toolq.core.record import ms_to_dt
from toolq.decisions.dep_actions import MAX_REASON, DepAction
from toolq.edges.cli.common import echo_json, handle_errors, open_ledger, redis_option
from toolq.edges.cli.common import state_dir_option as _state_dir
from toolq.edges.cli.operations import _actor
from toolq.edges.deps_text import BREAKER_WORDS, limit_text, paused_text, seconds_text

_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _state(redis_url: str | None, state_dir: Path | None) -> DepState:
    topology, client = open_ledger(redis_url, state_dir)
    return DepState(client, topology.layout)


def _now() -> int:
    return int(time.time() * 1000)


def render_list(views: Sequence[DepDetail], now_ms: int) -> str:
    """The table ``toolq deps`` prints."""
    if not views:
        return "no dependency keys in the ledger (a key appears once a call with it is claimed)"
    rows = [["KEY", "LIMIT", "IN FLIGHT", "WAITING", "PAUSED", "BREAKER", "ADMITTED", "LIMITED"]]
    for v in views:
        rows.append(
            [
                v.key,
                limit_text(v.limits),
                str(v.in_flight),
                str(v.waiting),
                paused_text(v.paused_until_ms, now_ms),
                BREAKER_WORDS[v.breaker],
                str(v.admitted),
                str(v.limited),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip


def render_one(v: DepDetail, now_ms: int) -> str:
    """What ``toolq deps show KEY`` prints."""
    lim = v.limits
    lines = [
        f"dependency  {v.key}" + ("" if v.cell is None else f"  (cell {v.cell})"),
        f"limit       {limit_text(lim)}",
        f"breaker     {BREAKER_WORDS[v.breaker]}  (opens after {lim.breaker_failures} failures "
        f"in {lim.breaker_window:g}s, stays open {lim.breaker_open:g}s; failures now {v.fails})",
    ]
    if v.open_until_ms is not None:
        lines.append(f"open until  {ms_to_dt(v.open_until_ms).isoformat()} "
                     f"(in {seconds_text(v.open_until_ms - now_ms)})")  # fmt: skip
    if v.probe:
        lines.append(f"probe       {v.probe}")
    if v.paused_until_ms is not None:
        lines.append(f"paused      until {ms_to_dt(v.paused_until_ms).isoformat()} "
                     f"({paused_text(v.paused_until_ms, now_ms, v.pause_code)})")  # fmt: skip
    else:
        lines.append("paused      no")
    lines += [
        f"in flight   {v.in_flight}",
        f"waiting     {v.waiting}",
        f"counters    admitted {v.admitted}  limited {v.limited}  paused {v.paused_count}  "
        f"opened {v.opened_count}",
    ]
    if v.last_used_ms is not None:
        lines.append(f"last used   {ms_to_dt(v.last_used_ms).isoformat()}")
    for a in v.actions:
        lines.append(f"operator    {ms_to_dt(a.at_ms).isoformat()}  {a.what} by {a.by}: {a.why}")
    return "\n".join(lines)


@click.group(
    invoke_without_command=True,
    epilog="""\b
A key's limiter lives in the ledger (its cell, with cells); a key is listed once a call
with it has been claimed. Lifting or closing makes the calls the key holds back due
now, spread over a moment, and records who, when and why on the key.""",
)
@redis_option
@_state_dir
@_json
@click.pass_context
@handle_errors
def deps(ctx: click.Context, redis_url: str | None, state_dir: Path, as_json: bool) -> None:
    """Dependency keys: limit, in flight, waiting, pause, breaker, counters.

    \b
    toolq deps                                   every key, one line each
    toolq deps show stripe                       one key, with operators' actions
    toolq deps lift stripe --reason "..."        end its shared backoff now
    toolq deps close stripe --reason "..."       close its open or half-open breaker
    """
    ctx.ensure_object(dict)
    ctx.obj["redis_url"], ctx.obj["state_dir"] = redis_url, state_dir
    if ctx.invoked_subcommand is not None:
        return
    now = _now()
    views = _state(redis_url, state_dir).views(now)
    if as_json:
        echo_json({"deps": [v.model_dump(mode="json") for v in views]})
    else:
        click.echo(render_list(views, now))


def _where(ctx: click.Context, redis_url: str | None, state_dir: Path | None) -> DepState:
    """The ledger the subcommand's own options name, else the group's."""
    parent = ctx.obj or {}
    return _state(redis_url or parent.get("redis_url"), state_dir or parent.get("state_dir"))


def _sub_options(f: Callable[..., Any]) -> Callable[..., Any]:
    return redis_option(
        click.option(
            "--state-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="The state directory `toolq up` wrote (default: the group's, .toolq).",
        )(_json(f))
    )


@deps.command(short_help="One key, with the operators' actions on it.")
@click.argument("key")
@_sub_options
@click.pass_context
@handle_errors
def show(
    ctx: click.Context, key: str, redis_url: str | None, state_dir: Path | None, as_json: bool
) -> None:
    """One key: limits, in flight, waiting, pause, breaker, counters, operators' actions."""
    now = _now()
    view = _where(ctx, redis_url, state_dir).view(key, now)
    if as_json:
        echo_json(view.model_dump(mode="json"))
    else:
        click.echo(render_one(view, now))


def _action(action: DepAction, short: str, doc: str) -> click.Command:
    @click.command(name=action.value, help=doc, short_help=short)
    @click.argument("key")
    @click.option(
        "--reason",
        required=True,
        help=f"Why (kept on the key with who and when; at most {MAX_REASON} characters).",
    )
    @_sub_options
    @click.pass_context
    @handle_errors
    def command(
        ctx: click.Context,
        key: str,
        reason: str,
        redis_url: str | None,
        state_dir: Path | None,
        as_json: bool,
    ) -> None:
        state = _where(ctx, redis_url, state_dir)
        done: DepActed = state.act(
            key, action, by=_actor(f"deps-{action.value}"), reason=reason, now_ms=_now()
        )
        if as_json:
            echo_json(done.model_dump(mode="json"))
        else:
            verb = "lifted the pause of" if action is DepAction.LIFT else "closed the breaker of"
            click.echo(f"{verb} {key}; {done.made_due} waiting calls due now")

    return command


deps.add_command(
    _action(
        DepAction.LIFT,
        "End a key's pause now; its held-back calls go now.",
        "End a key's shared backoff now (refused if it is not paused); the calls it held "
        "back go now, spread over a moment, not at the pause's end.",
    )
)
deps.add_command(
    _action(
        DepAction.CLOSE,
        "Close a key's open or half-open breaker.",
        "Close a key's open or half-open breaker (refused if it is closed): its failures are "
        "forgotten and the calls it held back go now. Do it once the provider is back.",
    )
)

COMMANDS = [deps]
