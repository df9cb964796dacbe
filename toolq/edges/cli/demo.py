"""``toolq demo``: the real stack against a provider that misbehaves on purpose, and
its report."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from toolq.edges.cli.common import CliError, Seconds
from toolq.edges.cli.foreground import Interrupts


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
    type=Seconds(10, 3600),
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
    from toolq.edges.demo import DemoOptions, run_demo

    opts = DemoOptions(
        ops=ops,
        seed=seed,
        timeout=timeout,
        calls_workers=calls_workers,
        provider_dedup=provider_dedup,
        progress=not quiet,
    )
    with Interrupts():
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
