"""``python -m bench``: run the benchmarks and write bench/RESULTS.md.

    python -m bench                      everything at full size (about 1.5 h on 2 CPUs)
    python -m bench throughput --calls 20000 --repeats 5 [--pattern batch] [--events]
    python -m bench io | commands | latency | delay
    python -m bench server [--server-calls 2000 --server-rounds 2]
    python -m bench scheduler [--sizes 1000,100000,1000000]
    python -m bench verify [--soak 600]
    python -m bench chaos [--ops 2000 --kills 30]
    python -m bench api [--api-polls 1000 --api-wait 30]
    python -m bench aio [--aio-calls 1000 --aio-worker-threads 64 --aio-repeats 3]
    python -m bench tracing [--tracing-calls 2000 --tracing-rounds 3 --main-tree DIR]
    python -m bench peers | crash [--systems toolq,celery,dramatiq --quick]  (bench.peers_bench)
    python -m bench limits [rate|outage|concurrency|overhead] [--quick] (bench.limits)

Each part rewrites its own section of RESULTS.md. An embedded Valkey is
started (appendonly off for the performance parts, on for chaos) unless
``--redis-url`` names a server; that server's current database is flushed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bench import report
from bench.common import server

PARTS = (
    "throughput", "io", "commands", "latency", "delay", "scheduler", "verify", "chaos", "api",
    "aio", "server", "tracing",
)  # fmt: skip


def _load(name: str) -> Any:
    path = report.RAW / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_part(part: str, a: argparse.Namespace, url: str) -> None:
    from bench import throughput as tp

    pools = [("prefork", 2), ("threads", a.threads)]
    if a.pools:
        pools = [p for p in pools if p[0] in a.pools.split(",")]
    if part == "throughput" and a.no_scheduler:
        # What-if: toolq without its scheduler running (the hot path never needs it).
        res = tp.throughput(url, a.calls, a.repeats, a.concurrency, pools, with_scheduler=False)
        text = tp.render_throughput(res).replace(
            "## (a) Throughput: no-op write, toolq vs bare Celery",
            "## (a') What if: the same without toolq's scheduler running",
        )
        report.update("nosched", text, res)
    elif part == "throughput":
        # Defaults against defaults (closed loop) is "throughput"; the batch pattern and
        # task events on both sides get sections of their own.
        name = "throughput" + ("-batch" if a.pattern == "batch" else "")
        name += "-events" if a.events else ""
        for pool in pools:
            res = tp.throughput(url, a.calls, a.repeats, a.concurrency, [pool], pattern=a.pattern)
            # Keep the other pool's last results: each pool can be re-run on its own.
            old = _load(name)
            if old and (old["calls"], old["repeats"]) == (a.calls, a.repeats):
                res["pools"] = {**old["pools"], **res["pools"]}
            report.update(name, tp.render_throughput(res), res)
            if name == "throughput" and "prefork -c 2" in res["pools"]:
                report.update("commands", tp.render_commands(res, _load("roundtrips")))
    elif part == "commands":
        rt = tp.round_trips(url, min(a.calls, 5000))
        report.RAW.mkdir(exist_ok=True)
        (report.RAW / "roundtrips.json").write_text(json.dumps(rt, indent=1))
        res = _load("throughput")
        if res is None:
            res = tp.throughput(url, min(a.calls, 5000), 1, a.concurrency, pools[:1])
        report.update("commands", tp.render_commands(res, rt))
    elif part == "io":
        io_pools = [(p, int(c)) for p, c in (x.split(":") for x in a.io_pools.split(","))]
        res = tp.io_bound(url, a.io_calls, a.io_repeats, io_pools)
        report.update("io", tp.render_io(res), res)
    elif part == "latency":
        base = _load("throughput")
        if base is None:
            raise SystemExit("run `python -m bench throughput` first: latency runs at half of it")
        runs = base["pools"]["prefork -c 2"]
        top = min(tp._summ(runs[s])["rate"] for s in tp.SIDES)
        res = tp.latency(url, top / 2, a.latency_seconds, a.latency_repeats)
        report.update("latency", tp.render_latency(res), res)
    elif part == "delay":
        base = _load("throughput")
        res = tp.delayed(
            url,
            a.delay_calls,
            a.delay_repeats,
            a.concurrency,
            1.0,
            base["pools"]["prefork -c 2"] if base else None,
        )
        report.update("delay", tp.render_delay(res), res)
    elif part == "scheduler":
        from bench import scheduler_bench

        res = scheduler_bench.run(url, [int(x) for x in a.sizes.split(",")], a.drain)
        report.update("scheduler", scheduler_bench.render(res), res)
    elif part == "verify":
        from bench import verify_bench

        res = verify_bench.run(
            url, a.verify_seconds, a.soak, k=a.verify_backlog, sustained_calls=a.verify_calls
        )
        report.update("verify", verify_bench.render(res), res)
    elif part == "api":
        from bench import api_bench

        res = api_bench.run(url, a.api_polls, a.api_wait)
        report.update("api", api_bench.render(res), res)
    elif part == "aio":
        from bench import aio_bench

        res = aio_bench.run(url, a.aio_calls, a.aio_worker_threads, a.aio_repeats)
        report.update("aio", aio_bench.render(res), res)
    elif part == "server":
        from bench import server_cost

        res = server_cost.run(url, a.server_calls, a.server_rounds, pools)
        report.update("server", server_cost.render(res), res)
    elif part == "tracing":
        from bench import tracing_bench

        res = tracing_bench.run(url, a.tracing_calls, a.tracing_rounds, 16, a.main_tree)
        report.update("tracing", tracing_bench.render(res), res)
    else:
        raise SystemExit(f"unknown part {part}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("peers", "crash"):
        # Their own options (--systems, --rounds, --quick): bench.peers_bench.
        from bench import peers_bench

        return peers_bench.main(args)
    if args[:1] == ["limits"]:  # limits per dependency: options of its own
        from bench import limits

        return limits.main(args[1:])
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("part", nargs="?", default="all", choices=("all", *PARTS))
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32, help="client calls in flight")
    ap.add_argument("--threads", type=int, default=8, help="threads pool size for (a)")
    ap.add_argument("--pools", default="", help="throughput: only these pools (prefork,threads)")
    ap.add_argument(
        "--pattern",
        default="closed",
        choices=("closed", "batch"),
        help="throughput: closed loop, or many submits then many waits",
    )
    ap.add_argument(
        "--events", action="store_true", help="task events on, on both sides (BENCH_EVENTS=1)"
    )
    ap.add_argument(
        "--io-pools",
        default="threads:16,threads:64",
        help="io: pool:concurrency list (threads, prefork, gevent)",
    )
    ap.add_argument(
        "--no-scheduler", action="store_true", help="throughput what-if: no toolq scheduler"
    )
    ap.add_argument("--io-calls", type=int, default=6400)
    ap.add_argument("--io-repeats", type=int, default=3)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--latency-repeats", type=int, default=3)
    ap.add_argument("--delay-calls", type=int, default=2000)
    ap.add_argument("--delay-repeats", type=int, default=3)
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--drain", type=int, default=100000)
    ap.add_argument("--verify-seconds", type=float, default=20.0)
    ap.add_argument("--soak", type=float, default=600.0, help="verification soak, seconds")
    ap.add_argument("--verify-backlog", type=int, default=2000, help="capacity backlog size")
    ap.add_argument("--verify-calls", type=int, default=2000, help="calls per sustained run")
    ap.add_argument("--api-polls", type=int, default=1000, help="api: concurrent long-polls")
    ap.add_argument("--api-wait", type=float, default=30.0, help="api: their ?wait= (s)")
    ap.add_argument("--aio-calls", type=int, default=1000, help="aio: concurrent calls")
    ap.add_argument("--aio-worker-threads", type=int, default=64, help="aio: worker threads")
    ap.add_argument("--aio-repeats", type=int, default=3, help="aio: waves per client")
    ap.add_argument("--server-calls", type=int, default=2000, help="server: calls per run")
    ap.add_argument("--server-rounds", type=int, default=2, help="server: rounds A B")
    ap.add_argument("--tracing-calls", type=int, default=2000, help="tracing: calls per round")
    ap.add_argument("--tracing-rounds", type=int, default=3, help="tracing: rounds A B C")
    ap.add_argument(
        "--main-tree", default="/work/main", help="tracing: the code before it, for `main`"
    )
    ap.add_argument("--ops", type=int, default=2000, help="chaos: operations")
    ap.add_argument("--kills", type=int, default=30, help="chaos: worker/scheduler kills")
    a = ap.parse_args(argv)
    if a.events:
        os.environ["BENCH_EVENTS"] = "1"  # read by both sides' workers (bench.procs)

    if a.part == "chaos":
        from bench import chaos

        return chaos.main(
            ["--ops", str(a.ops), "--kills", str(a.kills)]
            + (["--redis-url", a.redis_url] if a.redis_url else [])
        )
    parts = [p for p in PARTS if p != "chaos"] if a.part == "all" else [a.part]
    if a.part == "all":
        parts = ["throughput", "commands", "server", "io", "latency", "delay", "scheduler"]
        parts += ["verify", "api"]
        parts.append("aio")
    with server(a.redis_url, appendonly=False) as srv:
        report.update("env", report.env_section(srv.url, srv.note))
        for part in parts:
            srv.flush()
            run_part(part, a, srv.url)
    if a.part == "all":
        from bench import chaos

        return chaos.main(["--ops", str(a.ops), "--kills", str(a.kills)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
