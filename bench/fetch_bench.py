"""Many messages per fetch (issue 29): the throughput bench's no-op load with
``worker.fetch_batch`` at its default (64) and at 0 (kombu's path: one BRPOP and one
MULTI/EXEC per message), each against bare Celery in the same run, rounds alternating.

    python -m bench.fetch_bench [--calls 3000] [--rounds 3] [--pattern closed|batch]

Prints a markdown table (and writes ``bench/results/fetch-<pattern>.json``); the section
"Many messages per fetch" of RESULTS.md is written by hand from it.
"""

from __future__ import annotations

import argparse
import json
import os
from statistics import median
from typing import Any

from bench import report
from bench.common import server
from bench.throughput import throughput

VARIANTS = (("64 (default)", "64"), ("0 (kombu's path)", "0"))
COMMANDS = ("brpop", "evalsha", "eval", "multi", "exec", "lrange", "rpop")


def run(calls: int, rounds: int, pattern: str, pools: list[tuple[str, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with server(None) as s:
        for r in range(rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for label, value in order:
                os.environ["TOOLQ_WORKER__FETCH_BATCH"] = value
                res = throughput(s.url, calls, 1, 32, pools, pattern=pattern)
                for pool, runs in res["pools"].items():
                    out.setdefault(pool, {}).setdefault(label, []).append(
                        {"toolq": runs["toolq"][0], "bare": runs["bare"][0]}
                    )
    os.environ.pop("TOOLQ_WORKER__FETCH_BATCH", None)
    return out


def render(out: dict[str, Any], calls: int) -> str:
    rows = [
        "| pool | fetch_batch | toolq calls/s | bare calls/s | ratio (median of rounds) "
        "| worker CPU ms/call | " + " | ".join(f"{c}/call" for c in COMMANDS) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(COMMANDS),
    ]
    for pool, variants in out.items():
        for label, rounds in variants.items():
            t = median(x["toolq"]["rate"] for x in rounds)
            b = median(x["bare"]["rate"] for x in rounds)
            ratio = median(x["toolq"]["rate"] / x["bare"]["rate"] for x in rounds)
            cpu = median(x["toolq"]["cpu_ms_per_call"]["worker"] for x in rounds)
            per = [
                median(x["toolq"]["commands"].get(c, 0) / calls for x in rounds) for c in COMMANDS
            ]
            rows.append(
                f"| {pool} | {label} | {t:.1f} | {b:.1f} | **{ratio:.3f}** | {cpu:.2f} | "
                + " | ".join(f"{v:.2f}" for v in per)
                + " |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fetch_bench")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pattern", default="closed", choices=("closed", "batch"))
    ap.add_argument("--pools", default="prefork:2,threads:8")
    a = ap.parse_args(argv)
    pools = [(p.split(":")[0], int(p.split(":")[1])) for p in a.pools.split(",")]
    out = run(a.calls, a.rounds, a.pattern, pools)
    (report.RAW / f"fetch-{a.pattern}.json").write_text(json.dumps(out, indent=1))
    print(render(out, a.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
