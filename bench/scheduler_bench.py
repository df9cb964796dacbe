"""Issue 4: the scheduler against a large due set, and Celery countdowns beside it.

Operations waiting to retry are written straight into the ledger by a Lua
script (the fields the scheduler reads: ``state=waiting_retry``, tool,
attempt, max_attempts, deadline, ``retry_due``, rev, and a ``due`` entry),
so 10^6 of them take seconds, not an hour of submits. The scheduler runs as
its own process (:mod:`bench.sched_probe`) and publishes real Celery
messages to the calls queue; no worker consumes them and the queue is
dropped after each phase.

* **lag**: N items held far in the future, plus a stream of probe items
  falling due at a steady rate; lag = publish time - jittered due time, per
  dispatch (``TickStats.lags_ms``).
* **drain**: 10^5 items all due at once; items/s until the last is published.
* **RSS** of the scheduler process at each size.
* **Celery countdown** on the same server: lag of countdown tasks, worker
  memory while it holds them, and what a visibility timeout shorter than the
  countdown does (executions per task).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import redis

from bench import procs
from bench.common import fmt, percentile
from bench.report import table
from toolq.core.keys import Keys

PREFIX = "toolq"
KEYS = Keys(PREFIX)
CALLS_QUEUE = "toolq.calls"
BATCH = 10_000

POPULATE = r"""
local P, tag, first, count = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local base, step, deadline = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
for i = first, first + count - 1 do
  local ref = tag .. i
  local due = base + math.floor(i * step)
  redis.call('HSET', P .. ':op:' .. ref, 'ref', ref, 'tool', 'noop', 'state', 'waiting_retry',
    'attempt', 1, 'max_attempts', 5, 'deadline', deadline, 'retry_due', due, 'rev', 1,
    'args', '{"n":0}', 'fp', '', 'call_id', '', 'created', base, 'entered', base,
    'updated', base, 'vcheck', 0, 'vfail', 0, 'repubs', 0)
  redis.call('ZADD', P .. ':due', due, ref)
end
return count
"""


def fresh(r: redis.Redis, timeout: float = 120.0) -> None:
    """Empty the database and wait until the server has freed it.

    Valkey frees FLUSHDB and DEL in a background thread by default
    (``lazyfree-lazy-user-flush``/``-del``): freeing the 10^6 items of one
    phase took CPU from the next one on this 2-CPU machine (the first drain
    after the 10^6 lag run measured 6.7k items/s against 10-12k on a fresh
    server)."""
    r.flushdb(asynchronous=False)
    deadline = time.monotonic() + timeout
    while int(r.info("memory").get("lazyfree_pending_objects", 0)) and time.monotonic() < deadline:
        time.sleep(0.1)


def populate(r: redis.Redis, tag: str, n: int, base_ms: int, step_ms: float) -> float:
    """Write ``n`` waiting_retry operations, item i due at base + i*step; returns seconds."""
    script = r.register_script(POPULATE)
    deadline = int(time.time() * 1000) + 30 * 86400 * 1000
    t0 = time.perf_counter()
    for first in range(0, n, BATCH):
        script(args=[KEYS.tag, tag, first, min(BATCH, n - first), base_ms, step_ms, deadline])
    return time.perf_counter() - t0


def _probe(url: str, name: str, *, seconds: float = 0, until: int = 0) -> procs.Child:
    out = procs.LOG_DIR / f"{name}.json"
    ready = procs.LOG_DIR / f"{name}.ready"
    for f in (out, ready):
        f.unlink(missing_ok=True)
    args = ["-m", "bench.sched_probe", "--url", url, "--out", str(out), "--ready", str(ready)]
    if seconds:
        args += ["--seconds", str(seconds)]
    if until:
        args += ["--until", str(until), "--timeout", "600"]
    ch = procs.python_child(name, args)
    if not procs.wait_for(ready.exists, 60):
        ch.stop()
        raise RuntimeError(f"scheduler probe did not start:\n{ch.tail()}")
    return ch


def _result(ch: procs.Child, name: str, timeout: float) -> dict[str, Any]:
    try:
        ch.proc.wait(timeout=timeout)
    finally:
        ch.stop()
    data: dict[str, Any] = json.loads((procs.LOG_DIR / f"{name}.json").read_text())
    return data


def lag_at_size(url: str, n: int, rate: float, seconds: float) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    fresh(r)
    probes = min(n, int(rate * seconds))
    held = n - probes
    far = int(time.time() * 1000) + 86_400_000
    t_pop = populate(r, "held:", held, far, 0.0)
    mem = int(r.info("memory")["used_memory"])
    name = f"sched-lag-{n}"
    ch = _probe(url, name, seconds=probes / rate + 6)
    rss_idle = procs.rss_kb(ch.pid)
    start = int(time.time() * 1000) + 1500
    populate(r, "probe:", probes, start, 1000 / rate)
    r.lpush(KEYS.wake, "1")  # what the ledger's set_due does for an earlier item
    data = _result(ch, name, probes / rate + 60)
    queued = r.llen(CALLS_QUEUE)
    r.delete(CALLS_QUEUE)
    lags = data["lags_ms"]
    return {
        "n": n,
        "held": held,
        "probes": probes,
        "rate": rate,
        "populate_s": t_pop,
        "dispatched": len(lags),
        "queued": queued,
        "used_memory_mb": mem / 2**20,
        "p50_ms": percentile(lags, 50),
        "p99_ms": percentile(lags, 99),
        "max_ms": max(lags) if lags else float("nan"),
        "rss_idle_mb": rss_idle / 1024,
        "rss_max_mb": max(data["rss_kb"]) / 1024,
    }


def drain(url: str, n: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    fresh(r)
    now = int(time.time() * 1000)
    populate(r, "drain:", n, now - 1000, 0.0)
    name = f"sched-drain-{n}"
    ch = _probe(url, name, until=n)
    data = _result(ch, name, 600)
    ticks = data["ticks"]
    last = max(t for t, _taken, applied in ticks if applied) if ticks else data["t_end"]
    seconds = last - data["t0"]
    queued = r.llen(CALLS_QUEUE)
    r.delete(CALLS_QUEUE)
    lags = data["lags_ms"]
    return {
        "n": n,
        "applied": data["applied"],
        "queued": queued,
        "seconds": seconds,
        "rate": data["applied"] / seconds if seconds > 0 else float("nan"),
        "ticks": len(ticks),
        "p50_ms": percentile(lags, 50),
        "p99_ms": percentile(lags, 99),
        "rss_max_mb": max(data["rss_kb"]) / 1024,
    }


# ---------------------------------------------------------------------------- Celery countdown


def _executions(r: redis.Redis, key: str) -> list[tuple[float, float]]:
    out = []
    for raw in r.lrange(f"bench:countdown:{key}", 0, -1):
        at, eta = raw.decode().split(":")
        out.append((float(at), float(eta)))
    return out


def countdown_lag(url: str, n: int, countdown: float, spread: float) -> dict[str, Any]:
    """``n`` countdown tasks due over ``spread`` s, one worker (prefork -c 2, default VT)."""
    from bench.bare_app import make_app

    r = redis.Redis.from_url(url)
    fresh(r)
    w = procs.bare_worker("bare-countdown", url, pool="prefork", concurrency=2, queues="bare.calls")
    try:
        app = make_app(url)
        time.sleep(3)
        rss0 = procs.rss_kb(w.pid)
        t0 = time.time()
        for i in range(n):
            cd = countdown + spread * i / n
            app.send_task("bare.countdown", args=[f"lag:{i}", t0 + cd], countdown=cd)
        procs.wait_for(lambda: r.llen("bare.calls") == 0, 60, 0.2)
        time.sleep(1.0)
        rss_held = procs.rss_kb(w.pid)
        end = t0 + countdown + spread
        procs.wait_for(
            lambda: time.time() > end and r.exists(f"bench:countdown:lag:{n - 1}"),
            countdown + spread + 120,
            0.2,
        )
        time.sleep(2.0)
        lags = []
        runs = 0
        for i in range(n):
            ex = _executions(r, f"lag:{i}")
            runs += len(ex)
            if ex:
                lags.append((ex[0][0] - ex[0][1]) * 1000)
        app.close()
    finally:
        w.stop()
    return {
        "n": n,
        "countdown": countdown,
        "spread": spread,
        "executed": len(lags),
        "executions": runs,
        "p50_ms": percentile(lags, 50),
        "p99_ms": percentile(lags, 99),
        "rss_before_mb": rss0 / 1024,
        "rss_holding_mb": rss_held / 1024,
    }


def countdown_redelivery(
    url: str, n: int, countdown: float, vt: int, restore_interval: int | None
) -> dict[str, Any]:
    """Countdown longer than the visibility timeout: how often does each task run?"""
    from bench.bare_app import make_app

    r = redis.Redis.from_url(url)
    fresh(r)
    env = {"BENCH_VISIBILITY_TIMEOUT": str(vt)}
    if restore_interval:
        env["BENCH_RESTORE_INTERVAL"] = str(restore_interval)
    w = procs.bare_worker(
        "bare-countdown-vt", url, pool="prefork", concurrency=2, queues="bare.calls", env=env
    )
    try:
        import os

        os.environ["BENCH_VISIBILITY_TIMEOUT"] = str(vt)
        import importlib

        from bench import bare_app

        importlib.reload(bare_app)
        app = make_app(url)
        time.sleep(3)
        t0 = time.time()
        for i in range(n):
            app.send_task("bare.countdown", args=[f"vt:{i}", t0 + countdown], countdown=countdown)
        time.sleep(countdown + 3 * vt + 10)
        counts = [len(_executions(r, f"vt:{i}")) for i in range(n)]
        app.close()
        os.environ.pop("BENCH_VISIBILITY_TIMEOUT", None)
        importlib.reload(bare_app)
    finally:
        w.stop()
    return {
        "n": n,
        "countdown": countdown,
        "visibility_timeout": vt,
        "counts": counts,
        "restore_interval": restore_interval,
        "total": sum(counts),
        "max": max(counts),
        "min": min(counts),
    }


# ---------------------------------------------------------------------------- all of it


def _median_run(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """The first run, with each of ``keys`` replaced by its median over all runs."""
    out = dict(runs[0])
    for k in keys:
        out[k] = statistics.median(r[k] for r in runs)
    out["runs"] = runs
    return out


def run(
    url: str,
    sizes: list[int],
    drain_n: int,
    rate: float = 400.0,
    seconds: float = 10.0,
    repeats: int = 3,
) -> dict[str, Any]:
    out: dict[str, Any] = {"lag": [], "rate": rate, "seconds": seconds, "repeats": repeats}
    for n in sizes:
        runs = []
        for i in range(repeats):
            print(f"scheduler: lag with {n:,} items in the due set ({i + 1}/{repeats})", flush=True)
            runs.append(lag_at_size(url, n, rate, seconds))
            print(f"  {runs[-1]}", flush=True)
        out["lag"].append(_median_run(runs, ("p50_ms", "p99_ms", "max_ms", "rss_max_mb")))
    runs = []
    for i in range(repeats):
        print(f"scheduler: drain {drain_n:,} items due at once ({i + 1}/{repeats})", flush=True)
        runs.append(drain(url, drain_n))
        print(f"  {runs[-1]}", flush=True)
    out["drain"] = _median_run(runs, ("rate", "seconds", "p50_ms", "p99_ms", "rss_max_mb"))
    print("celery: countdown lag", flush=True)
    out["countdown"] = countdown_lag(url, 2000, 10.0, 5.0)
    print(f"  {out['countdown']}", flush=True)
    out["redelivery"] = []
    for restore in (None, 1):
        print(
            f"celery: countdown 12 s, visibility_timeout 5 s, restore every {restore}", flush=True
        )
        out["redelivery"].append(countdown_redelivery(url, 20, 12.0, 5, restore))
        print(f"  {out['redelivery'][-1]}", flush=True)
    redis.Redis.from_url(url).flushdb()
    return out


def render(res: dict[str, Any]) -> str:
    rows = [
        (
            f"{x['n']:,}",
            f"{x['probes']:,} at {x['rate']:.0f}/s",
            f"{x['dispatched']:,}",
            fmt(x["p50_ms"]),
            fmt(x["p99_ms"]),
            fmt(x["max_ms"]),
            fmt(x["rss_max_mb"]),
            fmt(x["used_memory_mb"], 0),
        )
        for x in res["lag"]
    ]
    d = res["drain"]
    c = res["countdown"]
    rss = [x["rss_max_mb"] for x in res["lag"]]
    flat = max(rss) - min(rss) if rss else float("nan")
    redeliveries = []
    for v in res["redelivery"]:
        hist: dict[int, int] = {}
        for k in v["counts"]:
            hist[k] = hist.get(k, 0) + 1
        sweep = (
            f"`unacked_restore_interval={v['restore_interval']}`, throttle 1"
            if v["restore_interval"]
            else "kombu's default unacked sweep (every ~100 s)"
        )
        redeliveries.append(
            f"- {v['n']} tasks, countdown {v['countdown']:.0f} s, `visibility_timeout="
            f"{v['visibility_timeout']}`, {sweep}: **{v['total']} executions**; per task: "
            + ", ".join(f"{k}x for {n}" for k, n in sorted(hist.items()))
        )
    drain_ok = "met" if d["rate"] >= 10_000 else "NOT met"
    drains = d.get("runs", [d])
    whole = all(r["applied"] == r["n"] == r["queued"] for r in drains)
    dispatched = (
        "each dispatched once in every run (messages in the queue = items)"
        if whole
        else "dispatched/queued per run: "
        + ", ".join(f"{r['applied']:,}/{r['queued']:,}" for r in drains)
    )
    return "\n".join(
        [
            "## (f) Scheduler: dispatch lag, drain, memory; Celery countdown beside it\n",
            f"Medians of {res.get('repeats', 1)} runs per size. "
            "One `toolq` scheduler process (batch 500, default settings); waiting_retry "
            "operations written straight into the ledger; lag = publish time - jittered due time "
            "(`TickStats.lags_ms`), for a steady stream of probe items falling due while the "
            "rest of the set is held a day ahead.\n",
            table(
                (
                    "items in due set",
                    "probe stream",
                    "dispatched",
                    "lag p50 ms",
                    "lag p99 ms",
                    "lag max ms",
                    "scheduler RSS MB",
                    "server used_memory MB",
                ),
                rows,
            ),
            f"\nScheduler RSS from {res['lag'][0]['n']:,} to {res['lag'][-1]['n']:,} items: "
            f"{min(rss):.1f} → {max(rss):.1f} MB (spread {flat:.1f} MB).\n",
            f"**Drain**: {d['n']:,} items due at once, {dispatched}; median of "
            f"{len(d.get('runs', [d]))} runs **{d['rate']:,.0f} items/s** (runs: "
            + ", ".join(f"{r['rate']:,.0f}" for r in d.get("runs", [d]))
            + f"; target ≥ 10,000/s: {drain_ok}), {d['seconds']:.2f} s; lag while draining "
            f"p50 {fmt(d['p50_ms'])} ms, p99 {fmt(d['p99_ms'])} ms; RSS max "
            f"{fmt(d['rss_max_mb'])} MB.\n",
            f"**Celery countdown on the same server** (bare Celery, prefork -c 2, default "
            f"visibility timeout): {c['n']:,} tasks with countdown {c['countdown']:.0f}-"
            f"{c['countdown'] + c['spread']:.0f} s: lag p50 {fmt(c['p50_ms'])} ms, p99 "
            f"{fmt(c['p99_ms'])} ms ({c['executed']:,} ran, {c['executions']:,} executions). "
            f"The worker fetched them all at once and held them in memory: RSS "
            f"{c['rss_before_mb']:.1f} → {c['rss_holding_mb']:.1f} MB while holding them.\n",
            "**Countdown past the visibility timeout** (bare Celery, one prefork -c 2 worker; "
            "the task appends one line per execution):\n",
            *redeliveries,
            "\ntoolq has no countdown: the delay lives in the scheduler's sorted set, and each "
            "dispatch is one compare-and-set on the operation's revision.",
        ]
    )
