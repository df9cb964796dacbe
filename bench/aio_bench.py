"""Issue 13: many concurrent ``tq.aio.call``s on one event loop.

    python -m bench aio [--aio-calls 1000 --aio-worker-threads 64 --aio-repeats 3]

One ``toolq worker`` (threads pool) serves ``bench.apps``' ``sleep100`` (a
100 ms write). This process is the client. Waves alternate, A B A B:

* **aio**: ``calls`` concurrent ``tq.aio.call``s started by one ``gather`` on
  one event loop. A ticker task sleeps 5 ms at a time: how late it wakes is how
  long the loop was blocked. The client's threads are sampled by the ticker;
  gen-2 garbage collections are timed (``gc.callbacks``), since a collection
  of the client's whole heap (Celery, kombu, pydantic: ~75k objects) is a pause
  of its own that no async code can avoid: ``tq.aio`` freezes that heap on its
  first use (``toolq.process.heap``); ``TOOLQ_CLIENT__FREEZE_HEAP=false`` runs without.
* **sync**: the same number of ``tq.call``s, one per thread (the sync client
  "with as many threads").

Then, with no worker running, ``calls`` waits are left pending and measured:
Python memory per pending wait (tracemalloc) and the RSS it added. Last, the
Redis side: the PUBLISHes per call (one per transition; the issue allows no
more) and what they cost the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import redis

from bench import apps, procs
from bench.common import commandstats, diff_stats, fmt, median, percentile
from bench.load import closed_loop
from bench.report import table
from toolq.process import heap

APP = "bench.apps:tq"
TOOL = "sleep100"
TICK = 0.005
#: The issue's bar for the longest block of the loop, and for aio vs sync throughput.
TARGET_BLOCK_MS = 20.0
TARGET_RATIO = 0.95


class Ticker:
    """Sleeps TICK at a time; records how late it woke, how much of that the loop's
    thread spent running code (its CPU time: the rest, the OS ran other processes),
    and the most threads seen."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self.busy: list[float] = []
        self.max_threads = threading.active_count()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(TICK)
            late = (loop.time() - before - TICK) * 1000
            self.late.append(late)
            # The thread's CPU time over the whole tick, capped at the lateness: an
            # upper bound of how long code on the loop kept the ticker waiting.
            self.busy.append(min(late, (time.thread_time() - cpu) * 1000))
            self.max_threads = max(self.max_threads, threading.active_count())


class GcPauses:
    """Durations (ms) of the generation-2 collections while installed."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._start) * 1000)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _threads_now() -> int:
    """Threads of this process as the kernel counts them (Python's and any other)."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


async def _aio_wave(n: int) -> dict[str, Any]:
    tq = apps.tq
    threads_before = threading.active_count()
    os_threads_before = _threads_now()
    ticker = Ticker()
    tick = asyncio.create_task(ticker.run())
    cpu0, t0 = time.process_time(), time.perf_counter()
    with GcPauses() as pauses:
        envs = await asyncio.gather(
            *(tq.aio.call(TOOL, {"n": i}, timeout=600) for i in range(n)), return_exceptions=True
        )
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    tick.cancel()
    failed = sum(1 for e in envs if isinstance(e, BaseException) or not e.ok)
    return {
        "rate": n / seconds,
        "seconds": seconds,
        "failed": failed,
        "client_cpu_ms_per_call": cpu * 1000 / n,
        "threads_before": threads_before,
        "threads_max": ticker.max_threads,
        "os_threads_before": os_threads_before,
        "os_threads_after": _threads_now(),
        "block_max_ms": max(ticker.late, default=0.0),
        "block_p99_ms": percentile(ticker.late, 99),
        "busy_max_ms": max(ticker.busy, default=0.0),
        "gc2_pauses": len(pauses.ms),
        "gc2_max_ms": max(pauses.ms, default=0.0),
    }


def _sync_wave(n: int) -> dict[str, Any]:
    tq = apps.tq
    failed = [0]

    def call(i: int) -> None:
        if not tq.call(TOOL, {"n": i}, timeout=600).ok:
            failed[0] += 1

    cpu0 = time.process_time()
    res = closed_loop(call, n, n)
    cpu = time.process_time() - cpu0
    return {
        "rate": res.rate,
        "seconds": res.seconds,
        "failed": failed[0] + res.errors,
        "client_cpu_ms_per_call": cpu * 1000 / n,
    }


async def _pending_waits(n: int) -> dict[str, Any]:
    """Memory of ``n`` waits on operations that stay queued (no worker runs)."""
    aio = apps.tq.aio
    refs = [(await aio.submit(TOOL, {"n": i})).operation_ref for i in range(n)]
    with contextlib.suppress(TimeoutError):  # the subscription is up before measuring
        await aio.wait(refs[0], timeout=0.0)
    gc.collect()
    rss0 = procs.rss_kb(os.getpid())
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    waits = [asyncio.create_task(aio.wait(r, timeout=600)) for r in refs]
    notifier = aio._bound_to[asyncio.get_running_loop()].notifier
    while notifier.sleeping() < n:  # each read its record and sleeps until a notice
        await asyncio.sleep(0.01)
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    rss1 = procs.rss_kb(os.getpid())
    added = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    left = aio.watching()
    for r in refs:  # nothing of them should run later
        await aio.cancel(r)
    return {
        "waits": n,
        "bytes_per_wait": added / n,
        "rss_kb_per_wait": (rss1 - rss0) / n,
        "watching_after_cancel": left,
    }


def _redis_cost(client: redis.Redis, before: dict[str, Any], calls: int) -> dict[str, Any]:
    after = client.info("commandstats")
    out: dict[str, Any] = {}
    for name in ("publish", "evalsha", "fcall"):
        b, a = before.get(f"cmdstat_{name}", {}), after.get(f"cmdstat_{name}", {})
        n = int(a.get("calls", 0)) - int(b.get("calls", 0))
        usec = float(a.get("usec", 0)) - float(b.get("usec", 0))
        out[name] = {"per_call": n / calls, "usec_each": usec / n if n else 0.0}
    return out


def run(url: str, calls: int, worker_threads: int, repeats: int) -> dict[str, Any]:
    tq = apps.tq
    tq.configure(redis_url=url)
    stats = redis.Redis.from_url(url)
    loop = asyncio.new_event_loop()
    out: dict[str, Any] = {
        "calls": calls,
        "worker_threads": worker_threads,
        "repeats": repeats,
        "aio": [],
        "sync": [],
    }
    try:
        print(f"aio: {calls} waits pending (no worker)", flush=True)
        out["pending"] = loop.run_until_complete(_pending_waits(calls))
        worker = procs.toolq_worker(
            "aio-worker", APP, url, pool="threads", concurrency=worker_threads, queues="toolq.calls"
        )
        try:
            # Warm up both clients (connections, the Celery message templates).
            for _ in range(3):
                tq.call(TOOL, {}, timeout=60)
            loop.run_until_complete(_aio_wave(min(calls, 50)))
            # tq.aio froze the import-time heap on its first use (toolq.process.heap), unless
            # TOOLQ_CLIENT__FREEZE_HEAP=false: the bench reports which it ran with.
            out["gc_freeze"] = heap.frozen()
            calls_before = stats.info("commandstats")
            total_calls = 0
            for r in range(repeats):
                waves: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                    ("aio", lambda: loop.run_until_complete(_aio_wave(calls))),
                    ("sync", lambda: _sync_wave(calls)),
                ]
                for side, wave in waves if r % 2 == 0 else waves[::-1]:
                    before = commandstats(stats)
                    res = wave()
                    res["commands_per_call"] = {
                        k: v / calls for k, v in diff_stats(before, commandstats(stats)).items()
                    }
                    out[side].append(res)
                    total_calls += calls
                    print(
                        f"  [aio] round {r + 1}/{repeats} {side:4s} {res['rate']:8.1f} calls/s "
                        f"({res['seconds']:.1f} s, failed {res['failed']})"
                        + (
                            f" loop max block {res['block_max_ms']:.1f} ms"
                            f" (running code {res['busy_max_ms']:.1f} ms)"
                            f" (gen-2 GC max {res['gc2_max_ms']:.1f} ms),"
                            f" threads {res['threads_before']} -> {res['threads_max']}"
                            if side == "aio"
                            else ""
                        ),
                        flush=True,
                    )
            out["redis"] = _redis_cost(stats, calls_before, total_calls)
        finally:
            worker.stop()
    finally:
        loop.run_until_complete(tq.aio.aclose())
        loop.close()
        stats.close()
        tq.close()
    return out


def render(res: dict[str, Any]) -> str:
    a, s = res["aio"], res["sync"]
    rate_a = median([w["rate"] for w in a])
    rate_s = median([w["rate"] for w in s])
    ratio = rate_a / rate_s if rate_s else float("nan")
    block = max(w["block_max_ms"] for w in a)
    busy = max(w["busy_max_ms"] for w in a)
    gc2 = max(w["gc2_max_ms"] for w in a)
    threads = f"{min(w['threads_before'] for w in a)} → {max(w['threads_max'] for w in a)}"
    rows = [
        ("calls/s (median of waves)", fmt(rate_a), fmt(rate_s)),
        ("aio / sync", f"**{ratio:.3f}** (target ≥ {TARGET_RATIO})", ""),
        (
            "client CPU per call, ms",
            fmt(median([w["client_cpu_ms_per_call"] for w in a]), 2),
            fmt(median([w["client_cpu_ms_per_call"] for w in s]), 2),
        ),
        ("client threads (before → most during a wave)", threads, f"{res['calls']:,} callers"),
        ("loop blocked at most, ms (a 5 ms ticker's lateness)", fmt(block), ""),
        (
            "… of it the loop's thread on CPU (running code), ms",
            f"**{fmt(busy)}** (target ≤ {TARGET_BLOCK_MS:.0f})",
            "",
        ),
        ("loop blocked p99, ms", fmt(max(w["block_p99_ms"] for w in a)), ""),
        ("longest gen-2 GC pause during a wave, ms", fmt(gc2), ""),
        ("failed calls", sum(w["failed"] for w in a), sum(w["failed"] for w in s)),
    ]
    p = res["pending"]
    r = res.get("redis", {})
    pub = r.get("publish", {})
    # The scripts are called with FCALL where the server has functions, else EVALSHA.
    ev = max(r.get("fcall", {}), r.get("evalsha", {}), key=lambda c: c.get("per_call", 0))
    return (
        "## Async client: concurrent `tq.aio.call`s on one event loop (issue 13)\n\n"
        f"{res['calls']:,} concurrent calls of a 100 ms write (one `gather`), worker "
        f"`--pool threads -c {res['worker_threads']}`, {res['repeats']} waves per side, "
        "alternating; the sync side is `tq.call` on as many threads as calls.\n\n"
        + table(("", "tq.aio (one loop)", "tq (threads)"), rows)
        + "\n\nPending waits (no worker running, "
        f"{p['waits']:,} waits on one loop): **{p['bytes_per_wait'] / 1024:.1f} KiB** of Python "
        f"memory each (tracemalloc), {p['rss_kb_per_wait']:.1f} KiB of RSS each; "
        f"{p['watching_after_cancel']} still registered after their tasks were cancelled.\n\n"
        f"Server side: {pub.get('per_call', 0):.2f} PUBLISH per call (one per transition: "
        f"queued, running, succeeded), {pub.get('usec_each', 0):.2f} µs each inside the "
        f"scripts; a script call (FCALL) costs {ev.get('usec_each', 0):.1f} µs on average, "
        f"{ev.get('per_call', 0):.2f} per call.\n\n"
        "The ticker's lateness is wall time: on a machine with fewer CPUs than busy "
        "processes (worker, server, client) it includes time the OS gave to others; the "
        "loop's own share is its thread's CPU time over the same tick. Both include any "
        "gen-2 garbage collection of the client's heap (Celery, kombu and pydantic make "
        "it ~75k objects, 26-63 ms to walk on a 2-CPU VM): `tq.aio` freezes them on its "
        "first use (`toolq.process.heap`, setting `client.freeze_heap`); this run: "
        + (
            "frozen (the default)."
            if res.get("gc_freeze")
            else "not frozen (`TOOLQ_CLIENT__FREEZE_HEAP=false`)."
        )
    )
