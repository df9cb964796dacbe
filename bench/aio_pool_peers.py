"""saq and arq in :mod:`bench.aio_pool_bench` (issue 29): the same loads as toolq's
``sleep`` and ``http`` scenarios on the peers' own single worker process.

``calls`` jobs of an ``async def`` function awaiting ``asyncio.sleep(seconds)`` (``saq``,
``saq-nosweep``, ``arq``), or a GET to the local provider answering after ``seconds``
through an ``httpx.AsyncClient`` per call (``saq-http``, ``arq-http``: the body of
toolq's tool, :mod:`bench.peers.http_call`) are queued first, then ONE worker process
is started at concurrency ``calls`` (saq: ``saq bench.peers.saq_peer.aio_settings`` with
``concurrency``; arq: ``arq bench.peers.arq_app.AioSettings`` with ``max_jobs``), each
system's defaults otherwise but saq's job timeout (10 s by default, as long as the call:
300 s here, arq's default).

Wall: each system's own stamps, taken by its worker, as toolq's ledger stamps are:

* saq: ``Job.started`` (set after the job is dequeued, before the worker writes it
  active) to ``Job.completed`` (set in ``finish``, before the worker writes it): the
  same points as toolq's first claim to last record;
* arq: the result's ``start_time`` (taken just before the function's coroutine is
  created, after the worker's pipeline that fetches the job) to ``finish_time`` (right
  after the function returns, before the result is written): a little tighter than
  toolq's (neither the fetch nor the last write is inside it).

In flight and RSS as toolq's (:mod:`bench.peers.inflight`: counted in the worker
process's memory, published by a thread); CPU: the worker process's, read once every
record is back. Run from :func:`bench.aio_pool_bench.main` (``--scenarios saq,arq``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import redis

from bench import procs
from bench.peers import inflight

PEERS = ("saq", "saq-nosweep", "arq", "saq-http", "arq-http")
#: saq's job timeout here (its default is 10 s); arq's default ``job_timeout``.
JOB_TIMEOUT_S = 300
#: How long the bench waits for the calls (toolq's scenarios: the same).
WAIT_S = 600


def label(system: str, calls: int) -> str:
    return {
        "saq": f"sleep, saq concurrency={calls}",
        "saq-nosweep": f"sleep, saq concurrency={calls}, first sweep held off",
        "arq": f"sleep, arq max_jobs={calls}",
        "saq-http": f"http, saq concurrency={calls}, first sweep held off",
        "arq-http": f"http, arq max_jobs={calls}",
    }[system]


def is_http(system: str) -> bool:
    """Whether ``system``'s scenario awaits the local HTTP provider."""
    return system.endswith("-http")


def available(system: str) -> bool:
    from bench.peers import available as peer_available

    return peer_available(system.split("-")[0])


def _span(starts: list[float], finishes: list[float]) -> tuple[float, float]:
    """(wall s, first to last start s) from epoch-ms stamps."""
    if not starts:
        return 0.0, 0.0
    first = min(starts)
    return (max(finishes) - first) / 1000, (max(starts) - first) / 1000


def _measure(r: redis.Redis, worker: procs.Child, calls: int, stamps: Any) -> dict[str, Any]:
    """Sample the worker until ``calls`` left the function and ``stamps()`` read every
    record back, then what toolq's ``one_run`` reports."""
    rss: list[int] = []
    stop = threading.Event()
    sampler = procs.sample_rss(worker.pid, stop, rss, 0.2)
    try:
        ok = procs.wait_for(
            lambda: int(r.get(inflight.DONE_KEY) or 0) >= calls or not worker.alive(),
            timeout=WAIT_S,
            interval=0.5,
        )
        # every record back (a dead or late worker: only what is there already)
        starts, finishes, succeeded = stamps(60.0 if ok and worker.alive() else 0.1)
    finally:
        stop.set()
        sampler.join()
    cpu = procs.cpu_seconds(worker.pid)
    wall, claims = _span(starts, finishes)
    return {
        "ok": ok and worker.alive() and succeeded == calls,
        "succeeded": succeeded,
        "wall_s": wall,
        "claims_s": claims,
        "max_in_flight": int(r.get(inflight.MAX_KEY) or 0),
        "rss_mb": max(rss or [0]) / 1024,
        "worker_cpu_s": cpu,
    }


def saq_run(
    url: str, calls: int, seconds: float, hold_sweep: bool = False, url_http: str = ""
) -> dict[str, Any]:
    """``hold_sweep``: the bench takes saq's sweep lock before the worker starts, as if
    its sweep had just run. At saq's defaults the worker's first sweep (at start, beside
    the first dequeues) aborts the jobs it finds in the active list not yet written
    active: with a backlog queued first, jobs the worker had just taken. ``url_http``:
    the jobs GET the provider there (``await_http``) instead of sleeping."""
    from saq import Queue

    from bench.peers.saq_peer import AIO_QUEUE

    r = redis.Redis.from_url(url)
    r.flushdb()
    loop = asyncio.new_event_loop()
    queue = Queue.from_url(url, name=AIO_QUEUE)

    async def submit() -> list[Any]:
        if url_http:
            return [
                await queue.enqueue(
                    "await_http", timeout=JOB_TIMEOUT_S, seconds=seconds, url=url_http
                )
                for _ in range(calls)
            ]
        return [
            await queue.enqueue("await_sleep", timeout=JOB_TIMEOUT_S, seconds=seconds)
            for _ in range(calls)
        ]

    async def read(jobs: list[Any], timeout: float) -> tuple[list[float], list[float], int]:
        starts, finishes, ok = [], [], 0
        for job in jobs:
            with contextlib.suppress(Exception):
                await job.refresh(until_complete=timeout)
            if job.status == "complete":
                ok += 1
                starts.append(float(job.started))
                finishes.append(float(job.completed))
        return starts, finishes, ok

    jobs = loop.run_until_complete(submit())
    if hold_sweep:
        r.set(queue.namespace("sweep"), 1, ex=WAIT_S)
    env = {"BENCH_PEER_URL": url, "BENCH_AIO_CONCURRENCY": str(calls)}
    w = procs.python_child("aio-pool-saq", ["-m", "saq", "bench.peers.saq_peer.aio_settings"], env)
    try:
        return _measure(r, w, calls, lambda t: loop.run_until_complete(read(jobs, t)))
    finally:
        w.stop(timeout=30)
        loop.run_until_complete(queue.disconnect())
        loop.close()
        r.close()


def arq_run(url: str, calls: int, seconds: float, url_http: str = "") -> dict[str, Any]:
    from bench.peers.arq_peer import Adapter

    r = redis.Redis.from_url(url)
    r.flushdb()
    submitter = Adapter(url)  # arq's own venv: a submitter process driven over a pipe
    submitter.aio_submit(calls, seconds, url_http)
    w = submitter.aio_worker(url, calls, "aio-pool-arq")

    def read(timeout: float) -> tuple[list[float], list[float], int]:
        got = submitter.aio_stamps(timeout)
        return got["starts"], got["finishes"], int(got["succeeded"])

    try:
        return _measure(r, w, calls, read)
    finally:
        w.stop(timeout=30)
        submitter.close()
        r.close()


def one_run(
    url: str, system: str, calls: int, seconds: float, url_http: str = ""
) -> dict[str, Any]:
    """One round of ``system`` (of :data:`PEERS`); ``url_http``: the provider of the
    ``-http`` systems. saq's http rounds hold its first sweep off (as ``saq-nosweep``:
    what it aborts at start is reported by the sleep rounds, not twice)."""
    if system == "saq-nosweep":
        return saq_run(url, calls, seconds, hold_sweep=True)
    if system == "saq-http":
        return saq_run(url, calls, seconds, hold_sweep=True, url_http=url_http)
    if system == "arq-http":
        return arq_run(url, calls, seconds, url_http)
    return {"saq": saq_run, "arq": arq_run}[system](url, calls, seconds)
