"""toolq against bare Celery: throughput, I/O-bound share, Redis cost, latency, 1 ms RTT.

Both sides run on the same server at the same time, each with its own worker
(same pool, same broker settings, ``bench.bare_app``); runs alternate
A B A B and the tables give medians. toolq runs with one scheduler beside
its worker, as it would be deployed (the scheduler is woken by lease
changes, and its commands are counted with toolq's).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procs
from bench.clients import make_client
from bench.common import commandstats, diff_stats, fmt, median, percentile
from bench.load import LoadResult, batch, closed_loop, open_loop
from bench.procs import events_on
from bench.report import table

SIDES = ("toolq", "bare")
APP = "bench.apps:tq"
WARMUP = 300


@dataclass
class Pair:
    """Running workers for both sides on one pool, and a client for each."""

    url: str
    pool: str
    concurrency: int
    kind: str = "noop"
    children: list[procs.Child] = field(default_factory=list)
    worker: procs.Child | None = None
    scheduler: procs.Child | None = None
    bare: procs.Child | None = None
    clients: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def pair(
    url: str,
    pool: str,
    concurrency: int,
    kind: str = "noop",
    client_url: str | None = None,
    tag: str = "",
    with_scheduler: bool = True,
) -> Iterator[Pair]:
    """Start a toolq worker + scheduler and a bare Celery worker on ``url``."""
    p = Pair(url, pool, concurrency, kind)
    name = f"{tag}{pool}{concurrency}"
    try:
        p.worker = procs.toolq_worker(
            f"tq-worker-{name}", APP, url, pool=pool, concurrency=concurrency, queues="toolq.calls"
        )
        p.children.append(p.worker)
        if with_scheduler:
            p.scheduler = procs.toolq_scheduler(f"tq-scheduler-{name}", APP, url)
            p.children.append(p.scheduler)
        p.bare = procs.bare_worker(
            f"bare-worker-{name}", url, pool=pool, concurrency=concurrency, queues="bare.calls"
        )
        p.children.append(p.bare)
        for side in SIDES:
            p.clients[side] = make_client(side, client_url or url, kind)
            warm = closed_loop(p.clients[side].call, WARMUP, min(32, 2 * concurrency))
            if warm.errors:
                raise RuntimeError(f"{side} warm-up failed; see {procs.LOG_DIR}")
        yield p
    finally:
        for c in p.clients.values():
            with contextlib.suppress(Exception):
                c.close()
        for ch in p.children:
            ch.stop()


def interleaved(
    p: Pair,
    stats_client: Any,
    calls: int,
    repeats: int,
    concurrency: int,
    label: str,
    pattern: str = "closed",
) -> dict[str, list[dict[str, Any]]]:
    """``repeats`` rounds of A B (order flipped every round); commandstats per run.

    ``pattern``: ``closed`` (each client thread calls, waits, calls again) or
    ``batch`` (all calls submitted, then all awaited: :func:`bench.load.batch`)."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    server_pid = int(stats_client.info("server").get("process_id", 0))
    for r in range(repeats):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        for side in order:
            cpu0 = cpu_snapshot(p, side, server_pid)
            before = commandstats(stats_client)
            client = p.clients[side]
            if pattern == "batch":
                res = batch(client.submit, client.wait, calls, concurrency)
            else:
                res = closed_loop(client.call, calls, concurrency)
            cmds = diff_stats(before, commandstats(stats_client))
            cpu1 = cpu_snapshot(p, side, server_pid)
            cpu_ms = {k: (cpu1[k] - cpu0[k]) * 1000 / calls for k in cpu0}
            failures = getattr(p.clients[side], "failures", 0)
            out[side].append(
                {
                    "rate": res.rate,
                    "seconds": res.seconds,
                    "errors": res.errors,
                    "p50_ms": percentile(res.latencies_ms, 50),
                    "p99_ms": percentile(res.latencies_ms, 99),
                    "commands": cmds,
                    "failures": failures,
                    "cpu_ms_per_call": cpu_ms,
                }
            )
            print(
                f"  [{label}] round {r + 1}/{repeats} {side:5s} {res.rate:8.1f} calls/s "
                f"({res.seconds:.1f} s, errors {res.errors})",
                flush=True,
            )
    return out


def cpu_snapshot(p: Pair, side: str, server_pid: int) -> dict[str, float]:
    """CPU seconds so far of the processes serving ``side`` (and of this client process)."""
    worker, scheduler, bare = p.worker, p.scheduler, p.bare
    assert worker is not None and bare is not None
    snap = {
        "client": time.process_time(),
        "server": procs.cpu_seconds(server_pid) if server_pid else 0.0,
    }
    if side == "toolq":
        snap["worker"] = procs.group_cpu(worker)
        snap["scheduler"] = procs.group_cpu(scheduler) if scheduler is not None else 0.0
    else:
        snap["worker"] = procs.group_cpu(bare)
        snap["scheduler"] = 0.0
    return snap


def _summ(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "rate": median([r["rate"] for r in runs]),
        "min": min(r["rate"] for r in runs),
        "max": max(r["rate"] for r in runs),
        "p50_ms": median([r["p50_ms"] for r in runs]),
        "p99_ms": median([r["p99_ms"] for r in runs]),
    }


def _ratios(runs: dict[str, list[dict[str, Any]]]) -> list[float]:
    """Per-round toolq/bare ratios (each round's two runs are adjacent in time)."""
    return [t["rate"] / b["rate"] for t, b in zip(runs["toolq"], runs["bare"], strict=True)]


# ---------------------------------------------------------------------------- (a) + (c)


def throughput(
    url: str,
    calls: int,
    repeats: int,
    concurrency: int,
    pools: list[tuple[str, int]],
    with_scheduler: bool = True,
    pattern: str = "closed",
) -> dict[str, Any]:
    import os

    import redis

    stats = redis.Redis.from_url(url)
    results: dict[str, Any] = {
        "calls": calls,
        "repeats": repeats,
        "concurrency": concurrency,
        "pattern": pattern,
        "events": events_on(),
        "bare_config": os.environ.get("BENCH_BARE_CONFIG", "defaults"),
        "pools": {},
    }
    for pool, conc in pools:
        print(f"throughput: {pool} -c {conc}, {calls} calls x {repeats} rounds", flush=True)
        with pair(url, pool, conc, with_scheduler=with_scheduler) as p:
            label = f"{pool} -c {conc}"
            runs = interleaved(p, stats, calls, repeats, concurrency, label, pattern)
        results["pools"][f"{pool} -c {conc}"] = runs
    return results


def settings_line(res: dict[str, Any]) -> str:
    """What both sides ran with: their defaults, or both with task events on."""
    bare = (
        "bare Celery as `pip install celery` ships it (early acks, prefetch multiplier 4) "
        "with the Redis result backend it needs to be awaited"
        if res.get("bare_config", "toolq") == "defaults"
        else "bare Celery with toolq's broker settings (late acks, prefetch 1) and the "
        "Redis result backend"
    )
    events = (
        "task events **on** on both sides (`toolq worker -E`, `worker_send_task_events`)"
        if res.get("events")
        else "task events off on both sides (both defaults)"
    )
    return f"toolq at its defaults against {bare}; {events}."


def render_throughput(res: dict[str, Any]) -> str:
    rows = []
    for pool, runs in res["pools"].items():
        t, b = _summ(runs["toolq"]), _summ(runs["bare"])
        ratios = _ratios(runs)
        rows.append(
            (
                pool,
                f"{fmt(t['rate'])} ({fmt(t['min'])}-{fmt(t['max'])})",
                f"{fmt(b['rate'])} ({fmt(b['min'])}-{fmt(b['max'])})",
                f"**{t['rate'] / b['rate']:.2f}**",
                f"{median(ratios):.2f}",
                f"{fmt(t['p50_ms'])} / {fmt(b['p50_ms'])}",
                f"{fmt(t['p99_ms'])} / {fmt(b['p99_ms'])}",
            )
        )
    if res.get("pattern") == "batch":
        title = "## (a) Throughput, many submits then many waits"
        how = (
            f"{res['concurrency']} client threads submit all {res['calls']:,} calls of a run, "
            "then wait for every one (one client process)"
        )
    else:
        title = "## (a) Throughput: no-op write, toolq vs bare Celery"
        how = f"{res['concurrency']} client threads in flight (closed loop, one client process)"
    if res.get("events"):
        title += ", task events on"
    return (
        f"{title}\n\n"
        f"{res['calls']:,} calls per run, {how}, {res['repeats']} rounds of A B alternating; "
        f"medians (min-max). toolq: submit → worker (claim, tool, record) → `wait`; "
        f"bare: `send_task` → worker → `AsyncResult.get` (Redis result backend). "
        f"{settings_line(res)}\n\n"
        + table(
            (
                "pool",
                "toolq calls/s",
                "bare calls/s",
                "ratio of medians",
                "median of per-round ratios",
                "p50 ms toolq / bare",
                "p99 ms toolq / bare",
            ),
            rows,
        )
        + "\n\n"
        + render_cpu(res["pools"])
    )


def render_cpu(pools: dict[str, Any]) -> str:
    """CPU ms per call by process: steadier than wall-clock rates on a shared machine."""
    rows = []
    for pool, runs in pools.items():
        for side in SIDES:
            parts = {
                k: median([r["cpu_ms_per_call"][k] for r in runs[side]])
                for k in ("client", "worker", "scheduler", "server")
            }
            rows.append(
                (pool, side, *(f"{parts[k]:.2f}" for k in parts), f"**{sum(parts.values()):.2f}**")
            )
    return (
        "CPU time per call by process (ms, medians over rounds; `client` is the one "
        "load-generating process, `worker` the worker's whole process group, `server` "
        "Valkey). On a 2-CPU machine shared with other jobs this is the steadier measure "
        "of cost:\n\n"
        + table(("pool", "side", "client", "worker", "scheduler", "server", "total"), rows)
    )


def render_commands(res: dict[str, Any], rt: dict[str, Any] | None) -> str:
    """(c): commands per call from the throughput runs; round trips from the proxy run."""
    parts = ["## (c) Redis commands and round trips per call\n"]
    pools = res["pools"]
    pool = "prefork -c 2" if "prefork -c 2" in pools else next(iter(pools))
    per: dict[str, dict[str, float]] = {}
    for side in SIDES:
        runs = pools[pool][side]
        calls = res["calls"]
        names = {k for r in runs for k in r["commands"]}
        per[side] = {k: median([r["commands"].get(k, 0) / calls for r in runs]) for k in names}
    rows = []
    for side in SIDES:
        d = per[side]
        total = sum(d.values())
        ev = d.get("evalsha", 0.0)
        rows.append((side, f"{total:.1f}", f"{ev:.2f}", f"{total - ev:.1f}"))
    parts.append(
        f"From `INFO commandstats` around each {pool} throughput run (medians; the counts "
        "include commands that Lua scripts run inside the server, and every process: "
        "client, worker, scheduler).\n\n"
        + table(
            (
                "side",
                "commands/call (all)",
                "EVALSHA/call",
                "other commands/call (incl. inside scripts)",
            ),
            rows,
        )
    )
    top = sorted(
        set(per["toolq"]) | set(per["bare"]),
        key=lambda k: -(per["toolq"].get(k, 0) + per["bare"].get(k, 0)),
    )
    parts.append(
        "\nPer command:\n\n"
        + table(
            ("command", "toolq/call", "bare/call"),
            [
                (k, f"{per['toolq'].get(k, 0):.2f}", f"{per['bare'].get(k, 0):.2f}")
                for k in top
                if per["toolq"].get(k, 0) >= 0.005 or per["bare"].get(k, 0) >= 0.005
            ],
        )
    )
    if rt:
        rows = []
        for side in SIDES:
            r = rt[side]
            rows.append(
                (
                    side,
                    f"{r['up_chunks_per_call']:.1f}",
                    f"{r['up_bytes_per_call']:,.0f}",
                    f"{r['down_bytes_per_call']:,.0f}",
                )
            )
        parts.append(
            f"\nRound trips, counted as client→server chunks through a zero-delay proxy that "
            f"every process connects through ({rt['calls']:,} calls, prefork -c 2; a pipeline "
            f"or MULTI/EXEC block is one trip, a script call is one trip):\n\n"
            + table(("side", "round trips/call", "bytes up/call", "bytes down/call"), rows)
        )
    return "\n".join(parts)


# ---------------------------------------------------------------------------- (b)


def io_bound(
    url: str,
    calls: int,
    repeats: int,
    pools: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """A 100 ms tool on each (pool, concurrency); 1.5x the pool in flight (the queue never
    runs dry), at most 96 per client process. ``calls`` is the size of a -c 64 run; other
    sizes run in proportion (the same seconds per run)."""
    import redis

    stats = redis.Redis.from_url(url)
    out: dict[str, Any] = {"calls": calls, "repeats": repeats, "pools": {}}
    for pool, c in pools or [("threads", 16), ("threads", 64)]:
        n = max(100, calls * c // 64)
        inflight = min(96, c * 3 // 2)
        label = f"{pool} -c {c}"
        print(f"io: sleep 100 ms, {label}, {n} calls x {repeats}", flush=True)
        with pair(url, pool, c, kind="sleep", tag="io-") as p:
            runs = interleaved(p, stats, n, repeats, inflight, f"io {label}")
        out["pools"][label] = {"calls": n, "inflight": inflight, "concurrency": c, "runs": runs}
    return out


def render_io(res: dict[str, Any]) -> str:
    rows = []
    verdicts = []
    for label, pr in res["pools"].items():
        c = int(pr.get("concurrency") or label.rsplit(" ", 1)[-1])
        ceiling = c * 10
        if " -c " not in label:  # results written before pools were named
            label = f"threads -c {label}"
        t, b = _summ(pr["runs"]["toolq"]), _summ(pr["runs"]["bare"])
        share = t["rate"] / ceiling
        rows.append(
            (
                label,
                ceiling,
                f"{pr['calls']:,} / {pr['inflight']}",
                fmt(t["rate"]),
                f"**{share:.3f}**",
                fmt(b["rate"]),
                f"{b['rate'] / ceiling:.3f}",
                f"{t['rate'] / b['rate']:.2f}",
                f"{fmt(t['p50_ms'])} / {fmt(b['p50_ms'])}",
                "/".join(f"{median([r['cpu_ms_per_call'][k] for r in pr['runs']['toolq']]):.2f}"
                         for k in ("worker", "server")),
            )
        )  # fmt: skip
        if c == 16 and label.startswith("threads"):
            verdicts.append(f"threads -c 16: **{'met' if share >= 0.95 else 'NOT met'}**")
    return (
        "## (b) I/O-bound: a tool that sleeps 100 ms\n\n"
        f"Ceiling = pool size / 0.1 s. {res['repeats']} rounds A B, medians; each side's "
        "worker runs the same pool. Target ≥ 0.95 of the ceiling on threads -c 16 "
        f"(160 calls/s, within the CPU of this 2-CPU machine): {', '.join(verdicts) or '-'}. "
        "The -c 64 row needs more CPU than the machine has (a call costs ~2.5-3 ms of CPU "
        "in all, so 640/s would take ~4 cores).\n\n"
        + table(
            (
                "pool",
                "ceiling calls/s",
                "calls per run / in flight",
                "toolq calls/s",
                "toolq share",
                "bare calls/s",
                "bare share",
                "toolq / bare",
                "p50 ms toolq / bare",
                "toolq CPU ms/call worker/server",
            ),
            rows,
        )
    )


# ---------------------------------------------------------------------------- proxies


@contextlib.contextmanager
def proxy(target_url: str, delay_ms: float, tag: str) -> Iterator[tuple[str, procs.Child, Path]]:
    """A delaying proxy in front of the server; yields (proxied url, child, stats file)."""
    from urllib.parse import urlsplit

    parts = urlsplit(target_url)
    port_file = procs.LOG_DIR / f"proxy-{tag}.port"
    stats_file = procs.LOG_DIR / f"proxy-{tag}.json"
    for f in (port_file, stats_file):
        f.unlink(missing_ok=True)
    ch = procs.python_child(
        f"proxy-{tag}",
        [
            "-m",
            "bench.delay_proxy",
            "--target",
            f"{parts.hostname}:{parts.port}",
            "--delay-ms",
            str(delay_ms),
            "--port-file",
            str(port_file),
            "--stats-file",
            str(stats_file),
        ],
    )
    try:
        if not procs.wait_for(port_file.exists, 10):
            raise RuntimeError("proxy did not start")
        time.sleep(0.05)
        port = int(port_file.read_text())
        url = parts._replace(netloc=f"{parts.hostname}:{port}").geturl()
        yield url, ch, stats_file
    finally:
        ch.stop()


def read_proxy_stats(ch: procs.Child, stats_file: Path) -> dict[str, int]:
    import signal

    stats_file.unlink(missing_ok=True)
    ch.signal_group(signal.SIGUSR1)
    procs.wait_for(stats_file.exists, 5)
    data: dict[str, int] = json.loads(stats_file.read_text())
    return data


def round_trips(url: str, calls: int) -> dict[str, Any]:
    print(f"round trips: {calls} calls per side through a 0 ms proxy", flush=True)
    out: dict[str, Any] = {"calls": calls}
    with proxy(url, 0.0, "rt") as (purl, ch, sf), pair(purl, "prefork", 2, tag="rt-") as p:
        for side in SIDES:
            before = read_proxy_stats(ch, sf)
            closed_loop(p.clients[side].call, calls, 32)
            after = read_proxy_stats(ch, sf)
            d = {k: after[k] - before[k] for k in after}
            out[side] = {
                "up_chunks_per_call": d["up_chunks"] / calls,
                "up_bytes_per_call": d["up_bytes"] / calls,
                "down_bytes_per_call": d["down_bytes"] / calls,
            }
            print(f"  {side}: {out[side]}", flush=True)
    return out


def delayed(
    url: str,
    calls: int,
    repeats: int,
    concurrency: int,
    delay_ms: float,
    base: dict[str, Any] | None,
) -> dict[str, Any]:
    import redis

    stats = redis.Redis.from_url(url)
    print(f"delay: {delay_ms} ms each way per chunk, {calls} calls x {repeats}", flush=True)
    with (
        proxy(url, delay_ms, "delay") as (purl, _ch, _sf),
        pair(purl, "prefork", 2, tag="delay-") as p,
    ):
        runs = interleaved(p, stats, calls, repeats, concurrency, f"+{delay_ms} ms")
    out: dict[str, Any] = {
        "calls": calls,
        "repeats": repeats,
        "delay_ms": delay_ms,
        "concurrency": concurrency,
        "runs": runs,
    }
    if base is not None:
        out["base"] = {s: _summ(base[s])["rate"] for s in SIDES}
    return out


def render_delay(res: dict[str, Any]) -> str:
    t, b = _summ(res["runs"]["toolq"]), _summ(res["runs"]["bare"])
    ratio = t["rate"] / b["rate"]
    rows = [
        (
            f"+{res['delay_ms']:g} ms per chunk",
            fmt(t["rate"]),
            fmt(b["rate"]),
            f"**{ratio:.2f}**",
            f"{median(_ratios(res['runs'])):.2f}",
            f"{fmt(t['p50_ms'])} / {fmt(b['p50_ms'])}",
        )
    ]
    if "base" in res:
        bt, bb = res["base"]["toolq"], res["base"]["bare"]
        rows.insert(0, ("none (from (a))", fmt(bt), fmt(bb), f"{bt / bb:.2f}", "", ""))
    return (
        "## (e) With 1 ms between every process and Redis\n\n"
        f"Every process (client, workers, scheduler) connects through `bench/delay_proxy.py`, "
        f"which holds each chunk {res['delay_ms']} ms in each direction (so a round trip costs "
        f"≥ {2 * res['delay_ms']:g} ms more). prefork -c 2, {res['calls']:,} calls per run, "
        f"{res['concurrency']} in flight, {res['repeats']} rounds A B, medians.\n\n"
        + table(
            (
                "added delay",
                "toolq calls/s",
                "bare calls/s",
                "ratio of medians",
                "median per-round ratio",
                "p50 ms toolq / bare",
            ),
            rows,
        )
    )


# ---------------------------------------------------------------------------- (d)


def latency(url: str, rate: float, seconds: float, repeats: int) -> dict[str, Any]:
    print(f"latency: open loop at {rate:.0f} calls/s for {seconds:.0f} s x {repeats}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
    with pair(url, "prefork", 2, tag="lat-") as p:
        for r in range(repeats):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                res: LoadResult = open_loop(p.clients[side].call, rate, seconds, max_in_flight=90)
                row = {
                    "p50_ms": percentile(res.latencies_ms, 50),
                    "p90_ms": percentile(res.latencies_ms, 90),
                    "p99_ms": percentile(res.latencies_ms, 99),
                    "achieved": len(res.latencies_ms) / res.seconds,
                    "errors": res.errors,
                }
                runs[side].append(row)
                print(
                    f"  [lat] {side:5s} p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms",
                    flush=True,
                )
    return {"rate": rate, "seconds": seconds, "repeats": repeats, "runs": runs}


def render_latency(res: dict[str, Any]) -> str:
    m = {
        s: {k: median([r[k] for r in res["runs"][s]]) for k in ("p50_ms", "p90_ms", "p99_ms")}
        for s in SIDES
    }
    rows = [(s, fmt(m[s]["p50_ms"]), fmt(m[s]["p90_ms"]), fmt(m[s]["p99_ms"])) for s in SIDES]
    rows.append(
        (
            "**toolq - bare**",
            f"**{m['toolq']['p50_ms'] - m['bare']['p50_ms']:+.1f}**",
            f"{m['toolq']['p90_ms'] - m['bare']['p90_ms']:+.1f}",
            f"**{m['toolq']['p99_ms'] - m['bare']['p99_ms']:+.1f}**",
        )
    )
    return (
        "## (d) Added latency at half load\n\n"
        f"Paced open-loop client at {res['rate']:.0f} calls/s (half the lower of the two "
        f"prefork -c 2 maxima from (a)) for {res['seconds']:.0f} s per run, {res['repeats']} "
        "rounds A B; latency from the scheduled send time to `wait`/`get` returning "
        "(medians of per-run percentiles).\n\n"
        + table(("side", "p50 ms", "p90 ms", "p99 ms"), rows)
    )
