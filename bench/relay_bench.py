"""``python -m bench.relay_bench``: what outbox mode (issue 18) costs a call.

Two modes on the same machine, alternating per round, each with its own fresh
processes (a prefork ``-c 2`` worker, a scheduler, and in outbox mode one relay):

- ``inline``: the ledger's Redis is the broker; a transition pushes its Celery
  message in the same script (the default);
- ``outbox``: ``TOOLQ_BROKER_URL`` names a second Valkey; a transition appends
  the message to the ledger's outbox stream and ``toolq relay`` publishes it.

Per round: a closed loop (``--calls`` calls, 16 in flight) for throughput, and
an open loop at ``--rate`` calls/s for latency (p50/p99 from the scheduled
start). The client runs in a subprocess of its own per round (the mode is a
setting of the client too). RabbitMQ would add its own round trip and publisher
confirm per message; this measures the outbox and the relay themselves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench import procs
from bench.common import fmt, median, percentile, server
from bench.load import closed_loop, open_loop
from bench.report import table, update

APP = "bench.apps:tq"
MODES = ("inline", "outbox")


def client_main(url: str, broker: str, calls: int, rate: float, seconds: float) -> None:
    """In the client subprocess: run both loads, print one JSON line."""
    from bench import apps

    tq = apps.tq
    tq.configure(redis_url=url)
    if broker:
        tq.app.configure_broker(broker)

    def call(i: int) -> None:
        env = tq.wait(tq.submit("noop", {"n": i}).operation_ref, timeout=60)
        if not env.ok:
            raise RuntimeError(env.code)

    closed_loop(call, 200, 16)  # warm-up
    closed = closed_loop(call, calls, 16)
    opened = open_loop(call, rate, seconds)
    print(
        json.dumps(
            {
                "rate": closed.rate,
                "errors": closed.errors + opened.errors,
                "p50": percentile(opened.latencies_ms, 50),
                "p99": percentile(opened.latencies_ms, 99),
            }
        )
    )
    tq.close()


def one_round(mode: str, url: str, broker_url: str, a: argparse.Namespace) -> dict[str, Any]:
    env = {"TOOLQ_BROKER_URL": broker_url} if mode == "outbox" else {}
    kids = [
        procs.toolq_worker(
            f"relay-{mode}-worker",
            APP,
            url,
            pool="prefork",
            concurrency=2,
            queues="toolq.calls,toolq.verify",
            env=env,
        ),
        procs.toolq_scheduler(f"relay-{mode}-scheduler", APP, url, env=env),
    ]
    relay = None
    if mode == "outbox":
        relay = procs.python_child(
            "relay-outbox-relay",
            ["-m", "toolq.edges.cli", "relay", "--app", APP, "--redis-url", url, "-l", "WARNING"],
            env,
        )
        kids.append(relay)
    try:
        time.sleep(3.0)  # workers up before the client's warm-up
        cpu0 = procs.group_cpu(relay) if relay else 0.0
        out = subprocess.run(
            [sys.executable, "-m", "bench.relay_bench", "--client", "--url", url]
            + (["--broker", broker_url] if mode == "outbox" else [])
            + ["--calls", str(a.calls), "--rate", str(a.rate), "--seconds", str(a.seconds)],
            env=procs.child_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        total = a.calls + 200 + int(a.rate * a.seconds)
        res["relay_cpu_ms"] = (procs.group_cpu(relay) - cpu0) * 1000 / total if relay else 0.0
        return res
    finally:
        for k in kids:
            k.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--broker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=2000, help="closed-loop calls per round")
    ap.add_argument("--rate", type=float, default=100.0, help="open-loop calls/s per round")
    ap.add_argument("--seconds", type=float, default=10.0, help="open-loop seconds per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.client:
        client_main(a.url, a.broker, a.calls, a.rate, a.seconds)
        return
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with server(None) as ledger, server(None) as broker:
        for r in range(a.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                ledger.flush()
                broker.flush()
                res = one_round(mode, ledger.url, broker.url, a)
                runs[mode].append(res)
                print(
                    f"  round {r + 1}/{a.rounds} {mode:7} {res['rate']:7.1f} calls/s, "
                    f"p50 {res['p50']:.1f} ms, p99 {res['p99']:.1f} ms, errors {res['errors']}",
                    flush=True,
                )
    rows = []
    for mode in MODES:
        rs = runs[mode]
        rows.append(
            (
                mode,
                fmt(median([x["rate"] for x in rs])),
                fmt(median([x["p50"] for x in rs])),
                fmt(median([x["p99"] for x in rs])),
                fmt(median([x["relay_cpu_ms"] for x in rs]), 3),
                sum(x["errors"] for x in rs),
            )
        )
    md = (
        "## Outbox mode: what the outbox and the relay add (issue 18)\n\n"
        f"`python -m bench.relay_bench`: per round, fresh processes (prefork -c 2 worker, "
        f"scheduler, and one relay in outbox mode), {a.calls:,} calls closed loop at 16 in "
        f"flight, then {a.rate:g} calls/s open loop for {a.seconds:g} s (latency from the "
        f"scheduled start); {a.rounds} rounds alternating, medians. `outbox`: the broker is a "
        "second embedded Valkey (`TOOLQ_BROKER_URL`); RabbitMQ adds its own publish round "
        "trip and confirm.\n\n"
        + table(
            ("mode", "calls/s", "p50 ms", "p99 ms", "relay CPU ms/call", "errors"),
            rows,
        )
    )
    update("relay", md, runs)
    print(md)


if __name__ == "__main__":
    main()
