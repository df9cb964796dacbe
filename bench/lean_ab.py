"""The asyncio pool's lean success on and off (issue 29): worker CPU per no-op call.

    python -m bench.lean_ab [--rounds 5] [--calls 2000]

``toolq worker -P asyncio -c 16`` and a scheduler (the peers bench's toolq side,
``BENCH_TOOLQ_POOL=asyncio:16``) on one embedded Valkey (``appendfsync always``);
each round starts a worker with ``TOOLQ_WORKER__LEAN_SUCCESS`` off, then one with it
on (the order flips every round), warms it with 300 calls, then submits ``calls``
no-op calls and awaits every one. CPU ms per call from /proc: the worker by thread
(its main thread is Celery's consumer on its hub; the busiest other is the pool's event
loop; the rest its ``def`` tool threads and Celery's), the server, this process.
Writes the medians to RESULTS.md ("Lean success on the asyncio pool").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import procs, report
from bench.peers.toolq_peer import POOL_ENV
from bench.peers_bench import Running, valkey
from bench.report import table

SWITCH = "TOOLQ_WORKER__LEAN_SUCCESS"
MODES = {"off": "false", "lean": "true"}
FIELDS = ("rate", "worker", "consumer", "loop", "rest", "server", "submitter", "load1")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds so far of each thread of ``pid``."""
    out: dict[int, float] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(t.name)] = (int(f[11]) + int(f[12])) / tck
    return out


def one(url: str, mode: str, calls: int) -> dict[str, float]:
    os.environ[SWITCH] = MODES[mode]
    run = Running(url, ["toolq"], tag=f"lean-{mode}-")
    c = redis.Redis.from_url(url)
    try:
        ad = run.adapters["toolq"]
        ad.wait(ad.submit("noop", range(300)), timeout=120)
        pid = run.children["toolq"][0].pid
        server = int(c.info("server")["process_id"])
        t0, s0, c0 = thread_cpu(pid), procs.cpu_seconds(server), time.process_time()
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
        w0 = time.perf_counter()
        failed = ad.wait(ad.submit("noop", range(calls)), timeout=600)
        secs = time.perf_counter() - w0
        t1, s1, c1 = thread_cpu(pid), procs.cpu_seconds(server), time.process_time()
    finally:
        run.close()
        c.close()
        os.environ.pop(SWITCH, None)
    ms = {k: (t1.get(k, 0.0) - t0.get(k, 0.0)) * 1000 / calls for k in t1}
    others = sorted((v for k, v in ms.items() if k != pid), reverse=True)
    return {
        "rate": calls / secs,
        "failed": failed,
        "worker": sum(ms.values()),
        "consumer": ms.get(pid, 0.0),
        "loop": others[0] if others else 0.0,
        "rest": sum(others[1:]),
        "server": (s1 - s0) * 1000 / calls,
        "submitter": (c1 - c0) * 1000 / calls,
        "load1": load1,
    }


def run(rounds: int, calls: int) -> dict[str, Any]:
    os.environ[POOL_ENV] = "asyncio:16"
    rows: list[dict[str, Any]] = []
    with valkey(None, "always") as url:
        for r in range(rounds):
            for mode in list(MODES) if r % 2 == 0 else list(MODES)[::-1]:
                row = {"mode": mode, "round": r, **one(url, mode, calls)}
                rows.append(row)
                print(row, flush=True)
    medians = {
        m: {f: statistics.median(x[f] for x in rows if x["mode"] == m) for f in FIELDS}
        for m in MODES
    }
    return {"rounds": rounds, "calls": calls, "rows": rows, "medians": medians}


def render(res: dict[str, Any]) -> str:
    med = res["medians"]
    rows = [
        (
            "Celery's tracer (`lean_success` off)" if m == "off" else "**lean success** (default)",
            f"{med[m]['rate']:.0f}",
            f"**{med[m]['worker']:.3f}**",
            f"{med[m]['consumer']:.3f}",
            f"{med[m]['loop']:.3f}",
            f"{med[m]['rest']:.3f}",
            f"{med[m]['server']:.3f}",
            f"{med[m]['submitter']:.3f}",
            f"{med[m]['load1']:.1f}",
        )
        for m in MODES
    ]
    by_round = {
        r: {x["mode"]: x["worker"] for x in res["rows"] if x["round"] == r}
        for r in range(res["rounds"])
    }
    per_round = ", ".join(f"{v['off']:.2f} / {v['lean']:.2f}" for v in by_round.values())
    return (
        "## Lean success on the asyncio pool (issue 29)\n\n"
        f"`python -m bench.lean_ab --rounds {res['rounds']} --calls {res['calls']}`: "
        "`toolq worker -P asyncio -c 16` and a scheduler on an embedded Valkey "
        "(`appendfsync always`); each round a worker with `worker.lean_success` off and "
        "one with it on, in an order flipped every round, each warmed with 300 calls, "
        f"then {res['calls']:,} no-op calls submitted and awaited. Medians; CPU ms per "
        "call from /proc, the worker by thread (consumer: Celery's hub on the main "
        "thread; loop: the pool's event loop; rest: `def` tool threads and Celery's). "
        "load1: the 1-minute load average at each run's start (a 2-CPU machine shared "
        "with other work).\n\n"
        + table(
            (
                "path",
                "calls/s",
                "worker CPU ms/call",
                "consumer",
                "loop",
                "rest",
                "server",
                "submitter",
                "load1",
            ),
            rows,
        )
        + f"\n\nWorker CPU ms/call per round, off / lean: {per_round}.\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lean_ab")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    res = run(a.rounds, a.calls)
    report.update("lean-ab", render(res), res)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
