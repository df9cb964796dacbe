"""Durability: what the safe default costs (``appendfsync always`` + WAITAOF on claims
and submits) against the old default (``appendfsync everysec``, nothing waited for).

    python -m bench.durability --calls 2000 --repeats 3

Two embedded Valkeys run side by side, one per arm, each with a toolq worker
(prefork -c 2) and a scheduler whose ``TOOLQ_DURABILITY`` matches; runs
alternate A B A B. Per arm: no-op write throughput (closed loop, 32 calls in
flight), CPU per call, latency at half the lower throughput (open loop), and
the WAITAOF calls the server counted. A probe first times one client's write
with and without WAITAOF on each ``appendfsync`` (what the decision in
:mod:`toolq.adapters.ledger.durability` rests on).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from bench import procs
from bench.apps import NoArgs
from bench.common import fmt, median, percentile
from bench.load import closed_loop, open_loop
from bench.report import table
from toolq import ToolQueue
from toolq.adapters.embedded import EmbeddedServer
from toolq.core.settings import ToolqSettings

APP = "bench.apps:tq"
WARMUP = 300
#: (label, appendfsync, TOOLQ_DURABILITY)
ARMS = (
    ("everysec, durability none (before)", "everysec", "none"),
    ("always, durability none", "always", "none"),
    ("always, durability fsync (default)", "always", "fsync"),
)
#: Valkey records event-loop stalls longer than this (ms), e.g. a slow fsync under
#: appendfsync always ("aof-fsync-always"): read back with LATENCY HISTORY.
LATENCY_THRESHOLD_MS = 5


@dataclass
class Arm:
    label: str
    appendfsync: str
    mode: str
    server: EmbeddedServer
    tq: ToolQueue
    children: list[procs.Child] = field(default_factory=list)

    def call(self, i: int) -> None:
        env = self.tq.wait(self.tq.submit("noop", {"n": i}).operation_ref, timeout=120)
        if not env.ok:
            raise RuntimeError(env.code)

    def stats(self) -> redis.Redis:
        return redis.Redis.from_url(str(self.server.url))


@contextlib.contextmanager
def arm(label: str, appendfsync: str, mode: str, tag: str) -> Iterator[Arm]:
    server = EmbeddedServer(
        appendfsync=appendfsync,
        extra_config={"latency-monitor-threshold": str(LATENCY_THRESHOLD_MS)},
    ).start()
    url = str(server.url)
    env = {"TOOLQ_DURABILITY": mode}
    tq = ToolQueue(url, name="bench", settings=ToolqSettings(durability=mode))  # type: ignore[arg-type]

    @tq.tool(name="noop", writes=True)
    def _noop(args: NoArgs) -> dict[str, Any]:
        return {}

    a = Arm(label, appendfsync, mode, server, tq)
    try:
        a.children.append(
            procs.toolq_worker(
                f"dur-{tag}-worker", APP, url, pool="prefork", concurrency=2,
                queues="toolq.calls", env=env,
            )
        )  # fmt: skip
        a.children.append(procs.toolq_scheduler(f"dur-{tag}-scheduler", APP, url, env=env))
        warm = closed_loop(a.call, WARMUP, 8)
        if warm.errors:
            raise RuntimeError(f"{label}: warm-up failed; see {procs.LOG_DIR}")
        yield a
    finally:
        tq.close()
        for ch in a.children:
            ch.stop()
        server.stop()


def waitaofs(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_waitaof", {}).get("calls", 0))


def stalls(client: redis.Redis) -> dict[str, int]:
    """Per latency event the server saw (over the threshold): the worst, in ms."""
    out: dict[str, int] = {}
    for row in client.execute_command("LATENCY", "LATEST"):
        name = row[0].decode() if isinstance(row[0], bytes) else str(row[0])
        out[name] = int(row[3])
    return out


def probe(writes: int = 300) -> dict[str, dict[str, float]]:
    """One client, one write at a time: SET alone and SET + WAITAOF 1 0 in one round trip."""
    out: dict[str, dict[str, float]] = {}
    for fsync in ("always", "everysec"):
        with EmbeddedServer(appendfsync=fsync) as server:
            r = redis.Redis.from_url(str(server.url))
            plain, waited = [], []
            for i in range(writes):
                t0 = time.perf_counter()
                r.set(f"k{i}", i)
                plain.append((time.perf_counter() - t0) * 1000)
            for i in range(writes if fsync == "always" else writes // 10):
                pipe = r.pipeline(transaction=False)
                pipe.set(f"k{i}", i)
                pipe.execute_command("WAITAOF", 1, 0, 2000)
                t0 = time.perf_counter()
                pipe.execute()
                waited.append((time.perf_counter() - t0) * 1000)
            r.close()
        out[fsync] = {
            "set_p50": percentile(plain, 50),
            "set_p99": percentile(plain, 99),
            "waitaof_p50": percentile(waited, 50),
            "waitaof_p99": percentile(waited, 99),
        }
        print(f"  probe {fsync}: {out[fsync]}", flush=True)
    return out


def run(calls: int, repeats: int, concurrency: int, latency_s: float) -> dict[str, Any]:
    res: dict[str, Any] = {
        "calls": calls,
        "repeats": repeats,
        "concurrency": concurrency,
        "latency_s": latency_s,
        "probe": probe(),
        "arms": {label: {"runs": [], "latency": []} for label, _, _ in ARMS},
    }
    with contextlib.ExitStack() as stack:
        arms = [stack.enter_context(arm(*spec, tag=str(i))) for i, spec in enumerate(ARMS)]
        for r in range(repeats):
            for a in arms if r % 2 == 0 else arms[::-1]:
                client = a.stats()
                pid = int(client.info("server")["process_id"])
                cpu0, w0 = procs.cpu_seconds(pid), waitaofs(client)
                out = closed_loop(a.call, calls, concurrency)
                cpu1, w1 = procs.cpu_seconds(pid), waitaofs(client)
                client.close()
                row = {
                    "rate": out.rate,
                    "p50_ms": percentile(out.latencies_ms, 50),
                    "p99_ms": percentile(out.latencies_ms, 99),
                    "errors": out.errors,
                    "server_cpu_ms_per_call": (cpu1 - cpu0) * 1000 / calls,
                    "waitaof_per_call": (w1 - w0) / calls,
                }
                res["arms"][a.label]["runs"].append(row)
                print(f"  [{a.label}] round {r + 1}: {row}", flush=True)
        for a in arms:
            client = a.stats()
            res["arms"][a.label]["stalls_ms"] = stalls(client)
            client.execute_command("LATENCY", "RESET")
            client.close()
        rate = min(median([x["rate"] for x in res["arms"][a.label]["runs"]]) for a in arms) / 2
        res["latency_rate"] = rate
        for r in range(repeats):
            for a in arms if r % 2 == 0 else arms[::-1]:
                out = open_loop(a.call, rate, latency_s, max_in_flight=90)
                row = {
                    "p50_ms": percentile(out.latencies_ms, 50),
                    "p99_ms": percentile(out.latencies_ms, 99),
                    "errors": out.errors,
                }
                res["arms"][a.label]["latency"].append(row)
                print(f"  [{a.label}] latency round {r + 1}: {row}", flush=True)
        for a in arms:
            client = a.stats()
            res["arms"][a.label]["latency_stalls_ms"] = stalls(client)
            client.close()
    return res


def render(res: dict[str, Any]) -> str:
    p = res["probe"]
    probe_rows = [
        (
            f"`appendfsync {f}`",
            f"{p[f]['set_p50']:.2f} / {p[f]['set_p99']:.2f}",
            f"{p[f]['waitaof_p50']:.2f} / {p[f]['waitaof_p99']:.2f}",
        )
        for f in ("always", "everysec")
    ]
    rows = []
    for label, data in res["arms"].items():
        runs, lat = data["runs"], data["latency"]
        rates = [x["rate"] for x in runs]
        worst = {**data.get("stalls_ms", {}), **data.get("latency_stalls_ms", {})}
        rows.append(
            (
                label,
                f"{fmt(median(rates))} ({fmt(min(rates))}-{fmt(max(rates))})",
                f"{fmt(median([x['p50_ms'] for x in runs]))} / "
                f"{fmt(median([x['p99_ms'] for x in runs]))}",
                f"{median([x['server_cpu_ms_per_call'] for x in runs]):.3f}",
                f"{median([x['waitaof_per_call'] for x in runs]):.2f}",
                f"{fmt(median([x['p50_ms'] for x in lat]))} / "
                f"{fmt(median([x['p99_ms'] for x in lat]))}",
                ", ".join(f"{x['p50_ms']:,.0f}/{x['p99_ms']:,.0f}" for x in lat),
                ", ".join(f"{k} {v}" for k, v in sorted(worst.items())) or "-",
            )
        )
    labels = list(res["arms"])
    before, after = (median([x["rate"] for x in res["arms"][k]["runs"]]) for k in labels[::2])
    return (
        "## Durability: `appendfsync always` + WAITAOF vs `everysec`\n\n"
        'What `durability="fsync"` (the default) waits for: the claim of a run and a '
        "submit are followed by `WAITAOF 1 0` in the same round trip "
        "(`toolq/adapters/ledger/durability.py`). One client, one write at a time, "
        "p50 / p99 ms:\n\n"
        + table(("server", "SET", "SET + WAITAOF"), probe_rows)
        + "\n\nOn `everysec`, WAITAOF answers at the next event-loop turn without an fsync "
        "(Valkey 9.1.2 carries redis/redis#13793: under strace, 20 acknowledged WAITAOFs "
        "in 2.2 s, one `fdatasync` a second), so toolq does not wait there and warns.\n\n"
        f"No-op write end to end (submit, claim, tool, record, `wait`), prefork -c 2 worker "
        f"and a scheduler per arm, each arm on its own embedded Valkey (AOF on), "
        f"{res['calls']:,} calls x {res['repeats']} rounds A B, {res['concurrency']} in "
        f"flight; latency: open loop at {res['latency_rate']:.0f} calls/s (half the lower "
        f"throughput) for {res['latency_s']:.0f} s x {res['repeats']}. Medians (min-max).\n\n"
        + table(
            (
                "arm",
                "calls/s",
                "closed-loop p50 / p99 ms",
                "server CPU ms/call",
                "WAITAOF/call",
                "latency at half load p50 / p99 ms",
                "per round p50/p99 ms",
                f"worst stall ms (events > {LATENCY_THRESHOLD_MS} ms)",
            ),
            rows,
        )
        + f"\n\nThroughput ratio default / before: **{after / before:.2f}**."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    ap.add_argument("--no-report", action="store_true")
    a = ap.parse_args(argv)
    res = run(a.calls, a.repeats, a.concurrency, a.latency_seconds)
    text = render(res)
    print(text)
    if not a.no_report:
        from bench import report

        report.update("durability", text, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
