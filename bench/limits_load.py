"""One closed-loop run of a toolq no-op load, in a process of its own; prints JSON.

    python -m bench.limits_load --app bench.apps:tq --tool noop --url URL --calls 3000

``python -m bench limits overhead`` runs it from this tree and from a checkout of
the commit it compares with (copied there), so each side's client runs that side's
code. It imports only what every commit since issue 14 has: toolq's client and
:mod:`bench.load`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from bench.load import closed_loop


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU time so far of ``pids`` (Linux /proc; 0 for a gone one)."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tck
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.limits_load")
    ap.add_argument("--app", required=True, help="module:attribute of the ToolQueue")
    ap.add_argument("--tool", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--pids", default="", help="processes whose CPU time to count (comma list)")
    a = ap.parse_args(argv)
    module, attr = a.app.split(":")
    tq = getattr(importlib.import_module(module), attr)
    tq.configure(redis_url=a.url)
    failures = [0]

    def call(i: int) -> None:
        env = tq.wait(tq.submit(a.tool, {"n": i}).operation_ref, timeout=120)
        if not env.ok:
            failures[0] += 1

    pids = [int(p) for p in a.pids.split(",") if p]
    closed_loop(call, a.warmup, a.concurrency)
    cpu0, server0 = time.process_time(), cpu_seconds(pids)
    res = closed_loop(call, a.calls, a.concurrency)
    cpu, server_cpu = time.process_time() - cpu0, cpu_seconds(pids) - server0
    tq.close()
    out = {
        "rate": res.rate,
        "seconds": res.seconds,
        "errors": res.errors,
        "failures": failures[0],
        "client_cpu_s": cpu,
        "pids_cpu_s": server_cpu,
        "toolq": str(importlib.import_module("toolq").__file__),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
