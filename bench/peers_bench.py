"""toolq beside the queues people compare it with (issue 29).

    python -m bench peers [--systems toolq,celery,dramatiq] [--calls 2000] [--rounds 5]
                          [--fsync always,everysec] [--io-calls 200] [--quick]
    python -m bench crash [--systems ...] [--calls 300] [--kills 3] [--settle 90] [--quick]
    BENCH_TOOLQ_POOL=asyncio:16 python -m bench peers --systems celery,toolq
        (a configured toolq, in a section of its own beside the defaults')

**peers**: one embedded Valkey (AOF on; ``appendfsync`` set per mode with
CONFIG SET) serves every system at once, each with its own worker processes
at its own defaults (:mod:`bench.peers`). Each round runs every system once,
in an order rotated every round: ``calls`` no-op tasks submitted from this
process, then every one awaited. Reported: tasks/s (medians), the median of
per-round ratios against bare Celery, and CPU ms per task of every process
(the system's workers, the server, this submitting process). Then the I/O-bound
load: each task sleeps 100 ms, at each system's default concurrency.

**crash**: every system at once; ``calls`` writes to a provider that never
deduplicates (a counter per call, :data:`bench.peers.CRASH_KEY`), each between
two 50 ms sleeps; the system's workers are SIGKILLed (every process) ``kills``
times while they run, then started again. After ``settle`` seconds past the
last kill the counters are read: 0 is a lost write, 2 or more a doubled one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis

from bench import peers, procs, report
from bench.common import fmt, median
from bench.report import table
from toolq.adapters.embedded import EmbeddedServer
from toolq.core.settings import ToolqSettings

WARMUP = 50


@contextlib.contextmanager
def valkey(url: str | None, appendfsync: str = "always") -> Iterator[str]:
    if url:
        yield url
        return
    emb = EmbeddedServer(appendonly=True, appendfsync=appendfsync)
    emb.start()
    try:
        yield str(emb.url)
    finally:
        emb.stop()


class Running:
    """Every selected system's adapter and worker processes on one server."""

    def __init__(self, url: str, systems: list[str], tag: str = "") -> None:
        self.url = url
        self.tag = tag
        self.adapters: dict[str, peers.Peer] = {}
        self.children: dict[str, list[procs.Child]] = {}
        for name in systems:
            self.adapters[name] = peers.make(name, url)
            self.children[name] = self.adapters[name].start(url, tag)

    def restart(self, name: str) -> None:
        for ch in self.children[name]:
            ch.kill()
        self.children[name] = self.adapters[name].start(self.url, self.tag)

    def cpu(self, name: str) -> float:
        return sum(procs.group_cpu(ch) for ch in self.children[name])

    def rss_mb(self, name: str) -> float:
        pids = [p for ch in self.children[name] for p in (ch.pid, *ch.descendants())]
        return sum(procs.rss_kb(p) for p in pids) / 1024

    def close(self) -> None:
        for name, chs in self.children.items():
            for ch in chs:
                ch.stop(timeout=5)
            with contextlib.suppress(Exception):
                self.adapters[name].close()


def _submitter_cpu(ad: peers.Peer) -> float:
    """This process, and the submitter process of an adapter that has one (arq)."""
    pids = getattr(ad, "client_pids", ())
    return time.process_time() + sum(procs.cpu_seconds(p) for p in pids)


def one_run(run: Running, name: str, task: str, n: int, server_pid: int) -> dict[str, Any]:
    ad = run.adapters[name]
    w0, s0, c0 = run.cpu(name), procs.cpu_seconds(server_pid), _submitter_cpu(ad)
    t0 = time.perf_counter()
    handles = ad.submit(task, range(n))
    failed = ad.wait(handles, timeout=300)
    secs = time.perf_counter() - t0
    w1, s1, c1 = run.cpu(name), procs.cpu_seconds(server_pid), _submitter_cpu(ad)
    return {
        "rate": n / secs,
        "seconds": secs,
        "failed": failed,
        "cpu_ms": {
            "workers": (w1 - w0) * 1000 / n,
            "server": (s1 - s0) * 1000 / n,
            "submitter": (c1 - c0) * 1000 / n,
        },
        "rss_mb": run.rss_mb(name),
    }


def interleaved(
    run: Running, task: str, calls: int, rounds: int, label: str
) -> dict[str, list[dict[str, Any]]]:
    stats = redis.Redis.from_url(run.url)
    server_pid = int(stats.info("server").get("process_id", 0))
    stats.close()
    names = list(run.adapters)
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            res = one_run(run, name, task, calls, server_pid)
            out[name].append(res)
            cpu = sum(res["cpu_ms"].values())
            print(
                f"  [{label}] round {r + 1}/{rounds} {name:8s} {res['rate']:8.1f} tasks/s "
                f"({res['seconds']:.1f} s, failed {res['failed']}, {cpu:.2f} CPU ms/task)",
                flush=True,
            )
    return out


def bench_peers(
    url: str | None,
    systems: list[str],
    calls: int,
    rounds: int,
    fsyncs: list[str],
    io_calls: int,
) -> dict[str, Any]:
    res: dict[str, Any] = {"calls": calls, "rounds": rounds, "io_calls": io_calls, "modes": {}}
    with valkey(url) as srv:
        c = redis.Redis.from_url(srv)
        run = Running(srv, systems, tag="bench-")
        try:
            for name in systems:  # warm-up: imports, connections, pools
                ad = run.adapters[name]
                if ad.wait(ad.submit("noop", range(WARMUP)), timeout=120):
                    raise RuntimeError(f"{name}: warm-up failed; see {procs.LOG_DIR}")
            res["concurrency"] = {n: run.adapters[n].concurrency for n in systems}
            for mode in fsyncs:
                c.config_set("appendfsync", mode)
                print(f"peers: no-op, appendfsync {mode}, {calls} x {rounds}", flush=True)
                res["modes"][mode] = interleaved(run, "noop", calls, rounds, mode)
            if io_calls:
                c.config_set("appendfsync", fsyncs[0])
                print(f"peers: sleep 100 ms, {io_calls} x 1", flush=True)
                res["io"] = interleaved(run, "sleep", io_calls, 1, "io")
        finally:
            run.close()
            c.close()
    return res


def _ratio(runs: dict[str, list[dict[str, Any]]], name: str) -> list[float]:
    return [a["rate"] / b["rate"] for a, b in zip(runs[name], runs["celery"], strict=False)]


def render_peers(res: dict[str, Any]) -> str:
    parts = [
        "## Peers: the same no-op load through toolq, Celery, dramatiq, huey, saq and arq\n",
        f"{res['calls']:,} no-op tasks submitted from one process, then every one awaited; "
        f"{res['rounds']} rounds, every system once a round in an order rotated each round, "
        "all on one embedded Valkey (AOF on) with every system's workers running throughout; "
        "each system at what `pip install` gives, with 2 worker processes. Medians (min-max). "
        "CPU ms per task: the system's worker processes (all of them), the server, and the "
        "submitting (and awaiting) process. Concurrency at the defaults: "
        + "; ".join(f"{k} {v}" for k, v in res.get("concurrency", {}).items())
        + ".\n",
    ]
    for mode, runs in res["modes"].items():
        rows = []
        for name, rs in runs.items():
            rates = [r["rate"] for r in rs]
            ratios = _ratio(runs, name) if "celery" in runs else []
            cpu = {k: median([r["cpu_ms"][k] for r in rs]) for k in rs[0]["cpu_ms"]}
            rows.append(
                (
                    f"**{name}**" if name == "toolq" else name,
                    f"{fmt(median(rates), 0)} ({fmt(min(rates), 0)}-{fmt(max(rates), 0)})",
                    f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                    if ratios
                    else "-",
                    f"{cpu['workers']:.2f} / {cpu['server']:.2f} / {cpu['submitter']:.2f}",
                    f"**{sum(cpu.values()):.2f}**",
                    sum(r["failed"] for r in rs),
                )
            )
        parts.append(
            f"\n`appendfsync {mode}`:\n\n"
            + table(
                (
                    "system",
                    "tasks/s",
                    "vs bare Celery (median of per-round ratios)",
                    "CPU ms/task workers / server / submitter",
                    "CPU ms/task, all",
                    "failed",
                ),
                rows,
            )
        )
    if "io" in res:
        rows = []
        for name, rs in res["io"].items():
            r = rs[0]
            rows.append(
                (
                    name,
                    res["concurrency"][name],
                    fmt(r["rate"]),
                    f"{sum(r['cpu_ms'].values()):.2f}",
                    fmt(r["rss_mb"], 0),
                    r["failed"],
                )
            )
        parts.append(
            f"\nI/O-bound: {res['io_calls']:,} tasks that each sleep 100 ms (`time.sleep` in "
            "the thread and process pools, `asyncio.sleep` in saq and arq), one round, at each "
            "system's default concurrency (its ceiling is concurrency / 0.1 s):\n\n"
            + table(
                (
                    "system",
                    "concurrency (defaults)",
                    "tasks/s",
                    "CPU ms/task, all",
                    "workers RSS MB",
                    "failed",
                ),
                rows,
            )
        )
    return "\n".join(parts)


# ------------------------------------------------------------------------------- crash


def in_flight(ad: peers.Peer) -> int:
    """The calls a system runs at once at its defaults (its ``concurrency`` leads with it)."""
    return int(ad.concurrency.split()[0])


def kill_times(duration: float, kills: int, rng: random.Random) -> list[float]:
    """Seconds after the submits: spread over the run, past the start, before the end."""
    return sorted(rng.uniform(min(1.0, duration * 0.2), duration * 0.8) for _ in range(kills))


def count(url: str, name: str, calls: int) -> dict[str, int]:
    c = redis.Redis.from_url(url)
    try:
        vals = c.mget([peers.crash_key(name, i) for i in range(calls)])
    finally:
        c.close()
    counts = [int(v or 0) for v in vals]
    return {
        "calls": calls,
        "written_once": sum(1 for x in counts if x == 1),
        "lost": sum(1 for x in counts if x == 0),
        "doubled": sum(1 for x in counts if x >= 2),
        "extra_writes": sum(x - 1 for x in counts if x >= 2),
    }


#: Smoke runs (``--quick``): stop settling once no system has a lost write for this long,
#: or once no system's counters have moved for :func:`smoke_quiet_s`.
SMOKE_COMPLETE_S = 10.0


def smoke_quiet_s(settings: ToolqSettings) -> float:
    """How long every counter must stay still before a smoke run stops waiting.

    A write another system lost for good (bare Celery's early acks, huey's lack of
    acknowledgement) never comes back, so waiting out ``--settle`` for it proves
    nothing. toolq's slowest recovery of a SIGKILLed worker's call is its lease running
    out, or a message lost with the worker being published again after
    ``recovery.unclaimed_after``, each noticed by the scheduler within ``max_sleep``:
    their sum, plus SMOKE_COMPLETE_S, is the bound (90 s at the defaults; the e2e test
    shortens the lease and ``unclaimed_after`` through TOOLQ_ variables).
    """
    return (
        settings.lease.seconds
        + settings.recovery.unclaimed_after
        + settings.scheduler.max_sleep
        + SMOKE_COMPLETE_S
    )


def smoke_settled(
    now: float, complete_since: float | None, unchanged_since: float, quiet_s: float
) -> bool:
    """A smoke run may stop settling: complete for SMOKE_COMPLETE_S, or still for ``quiet_s``."""
    if complete_since is not None and now - complete_since >= SMOKE_COMPLETE_S:
        return True
    return now - unchanged_since >= quiet_s


def bench_crash(
    url: str | None,
    systems: list[str],
    calls: int,
    kills: int,
    settle: float,
    seed: int,
    early: bool = False,
) -> dict[str, Any]:
    """``early`` (smoke runs): stop settling as :func:`smoke_settled` says."""
    res: dict[str, Any] = {"calls": calls, "kills": kills, "settle": settle, "seed": seed}
    with valkey(url) as srv:
        run = Running(srv, systems, tag="crash-")
        try:
            for name in systems:
                ad = run.adapters[name]
                if ad.wait(ad.submit("noop", range(5)), timeout=120):
                    raise RuntimeError(f"{name}: warm-up failed; see {procs.LOG_DIR}")
            logs: dict[str, dict[str, Any]] = {n: {"killed_at": []} for n in systems}
            rng = random.Random(seed)
            # One system at a time, each for the same time under the same kills: ``calls``
            # per 2 in flight (so saq's 20 at once get 10x toolq's 2 calls), 0.1 s each.
            # The kills and restarts happen on this thread: a child's PR_SET_PDEATHSIG fires
            # when the thread that started it ends, not only the process.
            for n in systems:
                logs[n]["calls"] = total = calls * max(1, in_flight(run.adapters[n]) // 2)
                logs[n]["unwritten_at_kill"] = []
                # Submitted from a thread, so the kills land while the writes run (a fast
                # system drains its queue while a slow submit is still going).
                sub = threading.Thread(target=run.adapters[n].submit, args=("crash", range(total)))
                t0 = time.monotonic()
                sub.start()
                for at in kill_times(calls * 0.05, kills, rng):
                    time.sleep(max(0.0, t0 + at - time.monotonic()))
                    logs[n]["unwritten_at_kill"].append(count(srv, n, total)["lost"])
                    run.restart(n)
                    logs[n]["killed_at"].append(round(at, 2))
                    print(
                        f"  [crash] {n}: SIGKILLed every worker process at {at:.1f} s "
                        f"({logs[n]['unwritten_at_kill'][-1]} of {total} not written yet)",
                        flush=True,
                    )
                sub.join()
            deadline = time.monotonic() + settle
            complete_since: float | None = None
            last: dict[str, dict[str, int]] = {}
            quiet_s = smoke_quiet_s(ToolqSettings())
            unchanged_since = time.monotonic()
            while (left := deadline - time.monotonic()) > 0:
                done = {n: count(srv, n, logs[n]["calls"]) for n in systems}
                now = time.monotonic()
                if done != last:
                    last, unchanged_since = done, now
                if any(d["lost"] for d in done.values()):
                    complete_since = None
                elif complete_since is None:
                    complete_since = now
                if early and smoke_settled(now, complete_since, unchanged_since, quiet_s):
                    break
                print(
                    f"  [crash] settling, {left:.0f} s left: "
                    + ", ".join(
                        f"{n} lost {d['lost']} doubled {d['doubled']}" for n, d in done.items()
                    ),
                    flush=True,
                )
                time.sleep(min(2.0 if early else 10.0, max(0.1, left)))
            res["systems"] = {n: {**logs[n], **count(srv, n, logs[n]["calls"])} for n in systems}
        finally:
            run.close()
    return res


def render_crash(res: dict[str, Any]) -> str:
    rows = [
        (
            f"**{n}**" if n == "toolq" else n,
            d["calls"],
            ", ".join(
                f"{t:.1f} s ({u:,})"
                for t, u in zip(d["killed_at"], d.get("unwritten_at_kill", []), strict=False)
            ),
            d["written_once"],
            f"**{d['lost']}**",
            f"**{d['doubled']}**",
            d["extra_writes"],
        )
        for n, d in res["systems"].items()
    ]
    return (
        "## Crash comparison: writes to a provider that never deduplicates\n\n"
        f"{res['calls']:,} writes per 2 calls a system runs at once (so each system's run "
        f"lasts about {res['calls'] * 0.05:.0f} s), each an INCR of its own counter between "
        "two 50 ms sleeps; every system at its defaults, one after the other on one Valkey "
        f"(AOF, `appendfsync always`), the others' workers running; each system's worker "
        f"processes all SIGKILLed {res['kills']} times at random moments while its writes "
        f"run (and started again), then {res['settle']:.0f} s past the last system's last "
        "kill for every system to recover before the counters are read (seed "
        f"{res['seed']}). Lost: counter 0; doubled: counter ≥ 2.\n\n"
        + table(
            (
                "system",
                "writes",
                "kills at (writes not yet done then)",
                "written once",
                "lost",
                "doubled",
                "extra writes",
            ),
            rows,
        )
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=("peers", "crash"))
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--systems", default=",".join(peers.SYSTEMS))
    ap.add_argument("--calls", type=int, default=None, help="peers 2000, crash 300")
    ap.add_argument("--rounds", type=int, default=None, help="peers: 5 (--quick 1)")
    ap.add_argument("--fsync", default="always,everysec", help="appendfsync modes, in order")
    ap.add_argument("--io-calls", type=int, default=None, help="200 (--quick 20); 0 skips it")
    ap.add_argument("--kills", type=int, default=None, help="crash: 3 (--quick 1)")
    ap.add_argument("--settle", type=float, default=90.0, help="crash: s after the last kill")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    a = ap.parse_args(argv)
    # SIGTERM (a timeout, Ctrl-C's cousin) unwinds like Ctrl-C, so every worker group is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    systems = [s for s in a.systems.split(",") if s]
    bad = [s for s in systems if s not in peers.SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {', '.join(bad)}; choose from {', '.join(peers.SYSTEMS)}")
    missing = [s for s in systems if not peers.available(s)]
    if missing:
        ap.error(f"not installed: {', '.join(missing)} (pip install -e '.[bench]')")
    if a.part == "peers":
        calls = a.calls or (100 if a.quick else 2000)
        rounds = a.rounds or (1 if a.quick else 5)
        fsyncs = a.fsync.split(",")[:1] if a.quick else a.fsync.split(",")
        io_calls = a.io_calls if a.io_calls is not None else (20 if a.quick else 200)
        res = bench_peers(a.redis_url, systems, calls, rounds, fsyncs, io_calls)
        # A configured toolq (BENCH_TOOLQ_POOL) goes in a section of its own, beside the
        # defaults' table, never over it.
        variant = os.environ.get("BENCH_TOOLQ_POOL")  # bench.peers.toolq_peer.POOL_ENV
        text = render_peers(res)
        if variant:
            text = text.replace("## Peers:", f"## Peers, toolq configured ({variant}):", 1)
        report.update("peers-configured" if variant else "peers", text, res)
        print(text)
    else:
        calls = a.calls or (40 if a.quick else 300)
        settle = a.settle
        kills = a.kills or (1 if a.quick else 3)
        res = bench_crash(a.redis_url, systems, calls, kills, settle, a.seed, early=a.quick)
        report.update("crash", render_crash(res), res)
        print(render_crash(res))
    print(json.dumps({"ok": True}), file=sys.stderr)
    return 0
