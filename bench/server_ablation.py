"""The server's cost per call, piece by piece: ablation of the ledger's Lua (issue 14).

    python -m bench.server_ablation [--calls 2000] [--rounds 3]

Issue 14 asks for the server's CPU per call at most bare Celery's; toolq's is
1.55-1.81x (bench/RESULTS.md, "Server cost per call"). What is left to cut is
per-call state the design keeps on purpose, which is the owner's call: this says
what each piece costs. Each variant is the shipped library with one piece of
per-call work taken out of the script text (:data:`VARIANTS`); the product is not
changed, the variant exists only in this process and in the server it loads into.

How: the script constants of :mod:`toolq.adapters.ledger.scripts` are edited in-process
(:func:`loaded_as`: every edit must match exactly once, so a change to the scripts
breaks this loudly instead of measuring the baseline twice), the library's name is
recomputed from the edited code as the module computes it (so ``FUNCTION LOAD``
loads the variant beside the others and ``FCALL`` names its functions), and
:func:`bench.server_cost.per_script` runs N submits, N claims, N records and N
waits back to back in this process, with the server's ``INFO cpu`` and
``INFO commandstats`` read per step. Variants alternate within a round (A B C ...,
reversed every other round, so a drift of the machine falls on all of them);
medians over rounds. The database is flushed before each run (the functions stay).

What these numbers are: one client process, no worker, no concurrency, on a
2-core machine other jobs share. They price the scripts' work in the server; they
leave out what a real call adds around them (the worker's kombu traffic, round
trips under load: "Server cost per call" has those, side by side with bare Celery).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from bench.common import median, server
from bench.report import RAW, table
from bench.server_cost import per_script
from toolq.adapters.ledger import scripts

#: The script constants a variant may edit (the names in :mod:`toolq.adapters.ledger.scripts`).
TEXTS = ("PRELUDE", "SUBMIT", "CLAIM", "APPLY")

#: Baseline / bare Celery, server CPU per call, side by side (bench/RESULTS.md, prefork).
MEASURED_RATIO = 1.55


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once) by ``new`` in script ``text``."""

    text: str
    old: str
    new: str


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    edits: tuple[Edit, ...] = ()


# The steps channel's notices (queued from SUBMIT, running from CLAIM); settled ones stay.
NO_STEPS = (
    Edit(
        "PRELUDE",
        "  redis.call('SPUBLISH', (SETTLED[state] and not steps) and NOTIFY or NOTIFY .. "
        "STEPS_SUFFIX,\n",
        "  if steps or not SETTLED[state] then return end\n  redis.call('SPUBLISH', NOTIFY,\n",
    ),
)
# The history entries (h<n>, hn): the fields and the building of their JSON. The reads
# of hn stay (the notices carry the entry's number).
NO_HISTORY = (
    Edit(
        "SUBMIT",
        "'published', (msg ~= '' and now) or 0,\n  'hn', 1, 'h1', entry(now, nil, state, "
        "attempt, 'submit'))",
        "'published', (msg ~= '' and now) or 0)",
    ),
    Edit(
        "CLAIM",
        "'rev', rev,\n      'hn', seq, 'h' .. seq, entry(at, state, 'running', f[2], holder))",
        "'rev', rev)",
    ),
    Edit(
        "APPLY",
        "        fields[7] = 'state'; fields[8] = to; fields[9] = 'hn'; fields[10] = seq\n"
        "        fields[11] = 'h' .. seq; fields[12] = entry(now, state, to, attempt, by, "
        "code or nil, note)\n"
        "        if to ~= state then fields[13] = 'entered'; fields[14] = now end\n",
        "        fields[7] = 'state'; fields[8] = to\n"
        "        if to ~= state then fields[9] = 'entered'; fields[10] = now end\n",
    ),
)
# The per-tool state indexes (idx:<tool>:<state>): SUBMIT's ZADD, CLAIM's and APPLY's moves.
NO_INDEXES = (
    Edit("SUBMIT", "redis.call('ZADD', idxkey(tool, state), now, ref)\n", ""),
    Edit(
        "CLAIM",
        "    redis.call('ZREM', idxkey(tool, state), ref)\n"
        "    redis.call('ZADD', idxkey(tool, 'running'), at, ref)\n",
        "",
    ),
    Edit(
        "APPLY",
        "      if not quiet and to ~= state then bmove(ref, tool, state, to, now) end\n",
        "",
    ),
)
# The stats hash's counters, and the tools set with them (its SADD hangs on the first count).
NO_STATS = (
    Edit(
        "PRELUDE",
        "local function stat(tool, name, n)\n"
        "  redis.call('HINCRBY', STATS, tool .. '|' .. name, n or 1)\nend\n",
        "local function stat(tool, name, n) end\n",
    ),
    Edit(
        "SUBMIT",
        "if redis.call('HINCRBY', STATS, tool .. '|submitted', 1) == 1 then\n"
        "  redis.call('SADD', TOOLS, tool)\nend\n"
        "if attempt > 0 then stat(tool, 'attempts') end\n",
        "",
    ),
)
# The claim's lease in the due set (queued -> running): without it no sweep finds a lease
# that ran out. SUBMIT's entry (the unclaimed check) and APPLY's removal stay.
NO_LEASE_DUE = (
    Edit(
        "CLAIM",
        "    set_due(ref, now + lease)\n    notify('running', ref, rev, seq)\n",
        "    notify('running', ref, rev, seq)\n",
    ),
)

VARIANTS = (
    Variant("baseline", "as shipped"),
    Variant("no steps notices", "no SPUBLISH for queued, running (settled stay)", NO_STEPS),
    Variant("no history", "no h<n>/hn fields in SUBMIT, CLAIM, APPLY", NO_HISTORY),
    Variant("no state indexes", "no ZADD/ZREM on idx:<tool>:<state>", NO_INDEXES),
    Variant("no stats", "no HINCRBY on the stats hash (nor the tools set's SADD)", NO_STATS),
    Variant("no lease in due set", "no ZADD due in CLAIM (breaks the lease sweep)", NO_LEASE_DUE),
    Variant(
        "all of the above",
        "the floor: the record, the idempotency check, the claim, the queue, settled notices",
        NO_STEPS + NO_HISTORY + NO_INDEXES + NO_STATS + NO_LEASE_DUE,
    ),
)


def edited(variant: Variant) -> dict[str, str]:
    """The script constants with ``variant``'s edits made (each must match exactly once)."""
    out = {name: getattr(scripts, name) for name in TEXTS}
    for e in variant.edits:
        found = out[e.text].count(e.old)
        if found != 1:
            raise AssertionError(
                f"variant {variant.name!r}: {e.text} holds {found} (not 1) of {e.old!r}: "
                "the scripts changed, update bench/server_ablation.py"
            )
        out[e.text] = out[e.text].replace(e.old, e.new)
    return out


def library_name() -> str:
    """The library's name from the module's current code, as :data:`scripts.LIBRARY` is."""
    code = scripts.PRELUDE + "".join(scripts._function(n) for n in scripts.NAMES)
    return "toolq_" + hashlib.sha256(code.encode()).hexdigest()[:12]


@contextlib.contextmanager
def loaded_as(variant: Variant) -> Iterator[str]:
    """:mod:`toolq.adapters.ledger.scripts` as ``variant`` in this process (its library's name):
    :func:`scripts.library` and :func:`scripts.function_name` answer for the variant
    until the block ends."""
    texts = edited(variant)
    saved = {name: getattr(scripts, name) for name in (*TEXTS, "_BODIES", "LIBRARY")}
    try:
        for name, text in texts.items():
            setattr(scripts, name, text)
        bodies = dict(scripts._BODIES)
        bodies.update(submit=texts["SUBMIT"], claim=texts["CLAIM"], apply=texts["APPLY"])
        scripts._BODIES = bodies
        scripts.LIBRARY = library_name()
        yield scripts.LIBRARY
    finally:
        for name, value in saved.items():
            setattr(scripts, name, value)


def load(r: redis.Redis, name: str) -> None:
    """Load the library :func:`scripts.library` builds now, and check the server has it."""
    try:
        r.function_load(scripts.library())
    except redis.ResponseError as exc:
        if "already exists" not in str(exc):
            raise
    assert r.function_list(library=name), f"library {name} not loaded"


def check(r: redis.Redis, variant: Variant) -> None:
    """What the run left shows the variant's edits took (and the baseline's work did not
    vanish): a record's history, the state indexes, the stats hash."""
    from bench import apps

    keys = apps.tq.ledger.keys
    op = next(r.scan_iter(match=keys.op("*"), count=1000), None)
    assert op is not None, "no record written"
    has = {
        "history": r.hexists(op, "h1"),
        "indexes": next(r.scan_iter(match=keys.index_prefix + "*", count=1000), None) is not None,
        "stats": bool(r.exists(keys.stats)),
    }
    gone = {
        "history": NO_HISTORY[0] in variant.edits,
        "indexes": NO_INDEXES[0] in variant.edits,
        "stats": NO_STATS[0] in variant.edits,
    }
    for piece, present in has.items():
        assert present != gone[piece], f"{variant.name}: {piece} present={present}"


def run_once(url: str, variant: Variant, calls: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    try:
        with loaded_as(variant) as name:
            r.flushdb()
            load(r, name)
            res = per_script(url, calls)
            check(r, variant)
    finally:
        r.close()
    steps = res["steps"]
    return {
        "library": name,
        "server_cpu_us": sum(s["server_cpu_us"] for s in steps.values()),
        "commands": sum(s["commands"] for s in steps.values()),
        # The scripts' own time (commandstats' fcall µs, their commands included): no
        # sockets, no event loop, what an edit to the Lua can move.
        "fcall_us": sum(s["by_command"].get("fcall", (0, 0))[1] for s in steps.values()),
        "steps": {k: {"server_cpu_us": s["server_cpu_us"], "commands": s["commands"],
                      "by_command": s["by_command"]} for k, s in steps.items()},
    }  # fmt: skip


def run(url: str, calls: int, rounds: int, variants: tuple[Variant, ...]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for i in range(rounds):
        for v in variants if i % 2 == 0 else variants[::-1]:
            m = run_once(url, v, calls)
            runs[v.name].append(m)
            print(
                f"  round {i + 1}/{rounds} {v.name:22s} {m['server_cpu_us']:6.1f} µs/call, "
                f"{m['commands']:.1f} commands/call",
                flush=True,
            )
    return {
        "calls": calls,
        "rounds": rounds,
        "ratio": MEASURED_RATIO,
        "variants": [{"name": v.name, "what": v.what, "runs": runs[v.name]} for v in variants],
    }


def render(res: dict[str, Any]) -> str:
    base_runs = res["variants"][0]["runs"]
    base = median([m["server_cpu_us"] for m in base_runs])
    steps = list(res["variants"][0]["runs"][0]["steps"])

    def paired(v: dict[str, Any], what: str) -> float:
        # Each round's baseline minus the variant's in the same round: drift of the
        # machine between rounds cancels.
        return median([b[what] - m[what] for b, m in zip(base_runs, v["runs"], strict=True)])

    rows = []
    for v in res["variants"]:
        cpu = [m["server_cpu_us"] for m in v["runs"]]
        med = median(cpu)
        per_step = " / ".join(
            f"{median([m['steps'][s]['server_cpu_us'] for m in v['runs']]):.0f}" for s in steps
        )
        rows.append(
            (
                v["name"],
                f"**{med:.0f}** ({', '.join(f'{c:.0f}' for c in cpu)})",
                "-" if v is res["variants"][0] else f"{base - med:.0f} ({(base - med) / base:.0%})",
                "-" if v is res["variants"][0] else f"{paired(v, 'server_cpu_us'):.0f}",
                "-" if v is res["variants"][0] else f"{paired(v, 'fcall_us'):.0f}",
                f"{median([m['fcall_us'] for m in v['runs']]):.0f}",
                f"{median([m['commands'] for m in v['runs']]):.1f}",
                per_step,
                v["what"],
            )
        )
    need = base * (1 - 1 / res["ratio"])
    return (
        f"## Server cost by ablation\n\n`python -m bench.server_ablation`: {res['calls']:,} "
        f"calls per run, {res['rounds']} rounds, variants interleaved (order reversed every "
        "other round); each run: submit, claim, record, wait, each step N times back to back "
        "in one process (no worker), on an embedded Valkey. Server CPU is `INFO cpu` of the "
        "server per call, summed over the steps; medians over rounds. A 2-core machine shared "
        "with other jobs: read differences of a few µs as noise. The scripts' own µs are "
        "`INFO commandstats`' `fcall` time (the three scripts, their commands included; no "
        "sockets). `wait` runs no script: its µs, the same work in every variant, show the "
        "noise. Paired savings: the median over rounds of the baseline's figure minus the "
        "variant's in the same round.\n\n"
        + table(
            (
                "variant",
                "server µs/call (rounds)",
                "saving vs baseline µs (%)",
                "saving, paired by round µs",
                "scripts' own saving, paired µs",
                "scripts' own µs/call",
                "commands/call",
                f"per step µs ({' / '.join(steps)})",
                "what is dropped",
            ),
            rows,
        )
        + f"\n\nFor the server's cost per call to fall by the measured ratio "
        f"{res['ratio']} -> 1.0, 1 - 1/{res['ratio']} = {1 - 1 / res['ratio']:.0%} of it must "
        f"go: {need:.0f} µs of this baseline's {base:.0f} µs (if the whole side-by-side cost "
        "scaled like this one; there the gap is 386 - 249 = 137 µs per call, of which the "
        "kombu traffic and round trips the two sides share are no part).\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.server_ablation", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--calls", type=int, default=1000, help="calls per run (default 1000)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds of all variants (default 12)")
    ap.add_argument("--only", nargs="*", default=None, help="variant names (baseline always)")
    a = ap.parse_args(argv)
    variants: tuple[Variant, ...] = VARIANTS
    if a.only:
        variants = tuple(v for v in VARIANTS if v.name == "baseline" or v.name in a.only)
    with server(None) as srv:
        print(f"server ablation: {a.calls} calls x {a.rounds} rounds, {srv.note}", flush=True)
        res = run(srv.url, a.calls, a.rounds, variants)
    text = render(res)
    print(text)
    RAW.mkdir(parents=True, exist_ok=True)
    (RAW / "server-ablation.json").write_text(json.dumps(slim(res), indent=1, default=str))
    return 0


def slim(res: dict[str, Any]) -> dict[str, Any]:
    """What the table is made of, per run: each step's numbers without its per-command
    table (which made the file ~230 kB)."""

    def step(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if not isinstance(v, (dict, list))}

    def run(m: dict[str, Any]) -> dict[str, Any]:
        return {**m, "steps": {name: step(s) for name, s in m["steps"].items()}}

    return {
        **res,
        "variants": [{**v, "runs": [run(m) for m in v["runs"]]} for v in res["variants"]],
    }


if __name__ == "__main__":
    sys.exit(main())
