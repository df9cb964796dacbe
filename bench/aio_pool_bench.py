"""Issue 29: slow I/O-bound calls in flight on one worker process, ``-P asyncio``.

    python -m bench.aio_pool_bench [--calls 2000 --seconds 10 --repeats 3] [--scenarios …]

Scenarios, each on a fresh worker process (one process, no children), the server
flushed between runs; a run queues every call first, then starts the worker and
waits for all of them to be recorded:

* **sleep**: ``calls`` calls of an ``async def`` tool awaiting ``seconds`` on one
  ``-P asyncio -c calls`` worker;
* **http**: the same tool awaiting a local HTTP provider that answers after ``seconds``
  (an ``httpx.AsyncClient`` per call: one shared by 2,000 calls holds the loop for
  minutes, :mod:`bench.aio_pool_app`; the provider is a child process here);
* **threads**, **threads-http**: the sleep and http scenarios on Celery's threads pool at
  ``-c calls`` (each thread awaits on its own loop), side by side;
* **sync**: ``bench.apps``' 100 ms I/O bench on ``-P asyncio -c 16`` (a ``def`` tool on
  the pool's threads): calls/s against the ceiling of 160/s, with a backlog of
  ``sync_calls`` submitted first so the queue never runs dry.
* **saq-nosweep**, **arq**, **saq-http**, **arq-http**: the sleep and http loads on ONE
  saq or arq worker process at concurrency ``calls``, measured the same way
  (:mod:`bench.aio_pool_peers`), in the same interleaved rounds as toolq's, rendered in a
  section of their own beside toolq's rows; **saq** (at its defaults, its first sweep
  free to abort jobs it just took) only when asked with ``--scenarios``.

Wall: the first claim to the last record (the worker's own time, not the submits'; the
ledger's stamps, taken by the worker when it asks for the claim or the record: the
last record is committed a round trip or a batch after its stamp, tens of ms).
In flight: the most calls inside the tool at once (counted in the worker process's
memory, the most published to Redis by a thread: :class:`bench.peers.inflight.InFlight`;
counted in Redis, the count's two round trips per call were part of the wall). RSS:
the worker's most, sampled every 0.2 s. Medians of ``repeats`` runs; the machine is
shared (2 CPUs, other jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import redis

from bench import aio_pool_peers, procs, report
from bench.common import fmt, median, server

APP = "bench.aio_pool_app:tq"
QUEUES = "toolq.calls,toolq.verify"
TARGET_WALL_S = 11.0
TARGET_RSS_MB = 200.0
TARGET_SHARE = 0.95
#: toolq's scenarios, and the peers' (:mod:`bench.aio_pool_peers`), for ``--scenarios``.
TOOLQ_SCENARIOS = ("sleep", "http", "threads", "threads-http", "sync")
PEER_SCENARIOS = aio_pool_peers.PEERS
#: The peers run by default, in toolq's rounds (saq at its defaults only when asked).
DEFAULT_PEERS = ("saq-nosweep", "arq", "saq-http", "arq-http")
HEADER = (
    "scenario",
    "succeeded",
    "max in flight",
    "wall s",
    "first to last claim s",
    "calls/s",
    "worker RSS MB",
    "worker CPU s",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_http(port: int) -> None:
    """A provider answering every GET after ``?s=`` seconds (HTTP/1.1, keep-alive)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode()
                seconds = float(line.split("?s=", 1)[1].split(" ", 1)[0]) if "?s=" in line else 0
                await asyncio.sleep(seconds)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", port, backlog=8192)
    async with srv:
        await srv.serve_forever()


def _worker(url: str, pool: str, c: int, name: str) -> procs.Child:
    if pool == "threads" and c > 1024:  # past `toolq worker`'s bound: Celery's own command
        argv = ["-m", "celery", "-A", "bench.aio_pool_app:celery_app", "worker"]
        argv += ["--pool", "threads", "-c", str(c), "-Q", QUEUES, "--loglevel", "WARNING"]
        argv += ["--without-mingle", "--without-gossip"]
        return procs.python_child(name, argv, {"TOOLQ_REDIS_URL": url})
    argv = ["-m", "toolq.edges.cli", "worker", "--app", APP, "--redis-url", url]
    argv += ["--pool", pool, "--concurrency", str(c), "-Q", QUEUES]
    return procs.python_child(name, argv)


def _sampler(pid: int, stop: threading.Event, out: list[int]) -> threading.Thread:
    return procs.sample_rss(pid, stop, out, 0.2)


def _submit(tq: Any, tool: str, args: dict[str, Any], calls: int) -> list[str]:
    return [tq.submit(tool, args).operation_ref for _ in range(calls)]


def _span_ms(tq: Any, refs: list[str]) -> tuple[float, float, float, int]:
    """The first and last claims and the last record (epoch ms) of ``refs``, and how many
    succeeded."""
    recs = [rec for rec in (tq.ledger.get(ref) for ref in refs) if rec is not None]
    claims = [h.at for rec in recs for h in rec.history if h.to == "running"]
    last = max(rec.updated_at.timestamp() * 1000 for rec in recs)
    return min(claims), max(claims), last, sum(1 for rec in recs if rec.state == "succeeded")


def one_run(
    url: str, pool: str, c: int, tool: str, args: dict[str, Any], calls: int, label: str
) -> dict[str, Any]:
    """``calls`` queued first, then one worker started: how it holds them all."""
    from bench.aio_pool_app import tq

    r = redis.Redis.from_url(url)
    r.flushdb()
    tq.configure(redis_url=url)
    refs = _submit(tq, tool, args, calls)
    w = _worker(url, pool, c, f"aio-pool-{label}")
    try:
        rss: list[int] = []
        stop = threading.Event()
        sampler = _sampler(w.pid, stop, rss)
        ok = procs.wait_for(lambda: _done(tq, refs) >= calls, timeout=600, interval=0.5)
        stop.set()
        sampler.join()
        cpu = procs.cpu_seconds(w.pid)
        first, last_claim, last, succeeded = _span_ms(tq, refs)
        return {
            "ok": ok,
            "succeeded": succeeded,
            "wall_s": (last - first) / 1000,
            "claims_s": (last_claim - first) / 1000,
            "max_in_flight": int(r.get("bench:inflight:max") or 0),
            "rss_mb": max(rss or [0]) / 1024,
            "worker_cpu_s": cpu,
        }
    finally:
        w.stop(timeout=30)
        tq.close()
        r.close()


def _done(tq: Any, refs: list[str]) -> int:
    """How many of ``refs`` are recorded succeeded, failed or escalated (one pipeline)."""
    pipe = tq.redis.pipeline(transaction=False)
    for ref in refs:
        pipe.hget(tq.ledger.keys_of(ref).op(ref), "state")
    return sum(1 for s in pipe.execute() if s in (b"succeeded", b"failed", b"escalated"))


def sync_run(url: str, calls: int, c: int = 16) -> dict[str, Any]:
    """``sleep100`` (a ``def`` tool) on ``-P asyncio -c c``: a backlog, then its rate."""
    res = one_run(url, "asyncio", c, "sleep100", {}, calls, "sync")
    rate = calls / res["wall_s"]
    return {**res, "rate": rate, "ceiling": c * 10, "share": rate / (c * 10)}


@contextlib.contextmanager
def _provider(needed: bool) -> Iterator[str]:
    """The local HTTP provider (a child process) when ``needed``: its URL, else ``""``."""
    if not needed:
        yield ""
        return
    port = _free_port()
    child = procs.python_child(
        "aio-pool-http", ["-m", "bench.aio_pool_bench", "--serve-http", str(port)]
    )
    try:
        url_http = f"http://127.0.0.1:{port}/"
        if not procs.wait_for(lambda: _answers(port), timeout=30, interval=0.1):
            raise RuntimeError(f"the local HTTP provider did not answer on port {port}")
        yield url_http
    finally:
        child.stop()


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


def _is_http(scenario: str) -> bool:
    return scenario in ("http", "threads-http") or aio_pool_peers.is_http(scenario)


def run(
    url: str,
    calls: int,
    seconds: float,
    repeats: int,
    sync_calls: int,
    http: bool = True,
    scenarios: tuple[str, ...] = TOOLQ_SCENARIOS,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``scenarios`` (of :data:`TOOLQ_SCENARIOS` and :data:`PEER_SCENARIOS`), ``repeats``
    interleaved rounds, toolq's and the peers' in the same rounds: (toolq's results,
    the peers'), each ``None`` when none of its scenarios was chosen."""
    if not http:
        scenarios = tuple(s for s in scenarios if not _is_http(s))
    ours = [s for s in TOOLQ_SCENARIOS if s in scenarios]
    peers = [s for s in PEER_SCENARIOS if s in scenarios]
    out: dict[str, Any] = {"calls": calls, "seconds": seconds, "repeats": repeats, "runs": {}}
    peer_out: dict[str, Any] = {**out, "runs": {}}
    peer_out["missing"] = [s for s in peers if not aio_pool_peers.available(s)]
    peers = [s for s in peers if s not in peer_out["missing"]]
    with _provider(any(_is_http(s) for s in ours + peers)) as url_http:
        wait = {"seconds": seconds}
        get = {"seconds": seconds, "url": url_http}
        every: dict[str, tuple[str, str, str, dict[str, Any]]] = {
            "sleep": (f"sleep, asyncio -c {calls}", "asyncio", "await_sleep", wait),
            "http": (f"http, asyncio -c {calls}", "asyncio", "await_http", get),
            "threads": (f"sleep, threads -c {calls}", "threads", "await_sleep", wait),
            "threads-http": (f"http, threads -c {calls}", "threads", "await_http", get),
        }
        for i in range(repeats):  # interleaved: A B C A B C
            for scenario in [s for s in ours if s in every] + peers:
                if scenario in every:
                    label, pool, tool, args = every[scenario]
                    print(f"aio-pool: {label}, round {i + 1}", flush=True)
                    res = one_run(url, pool, calls, tool, args, calls, scenario)
                    out["runs"].setdefault(label, []).append(res)
                else:
                    label = aio_pool_peers.label(scenario, calls)
                    print(f"aio-pool: {label}, round {i + 1}", flush=True)
                    res = aio_pool_peers.one_run(
                        url, scenario, calls, seconds, url_http if _is_http(scenario) else ""
                    )
                    peer_out["runs"].setdefault(label, []).append(res)
                print(f"  {res}", flush=True)
    out["sync"] = []
    for i in range(repeats if "sync" in ours else 0):
        print(f"aio-pool: sync 100 ms, asyncio -c 16, round {i + 1}", flush=True)
        res = sync_run(url, sync_calls)
        print(f"  {res}", flush=True)
        out["sync"].append(res)
    return (out if ours else None), (peer_out if peers or peer_out["missing"] else None)


def _row(label: str, runs: list[dict[str, Any]], calls: int) -> tuple[str, ...]:
    return (
        label,
        f"{min(r['succeeded'] for r in runs):,} / {calls:,}",
        fmt(median([r["max_in_flight"] for r in runs]), 0),
        f"**{fmt(median([r['wall_s'] for r in runs]))}**",
        fmt(median([r.get("claims_s", 0.0) for r in runs])),
        fmt(median([calls / r["wall_s"] if r["wall_s"] else 0.0 for r in runs])),
        f"**{fmt(median([r['rss_mb'] for r in runs]), 0)}**",
        fmt(median([r["worker_cpu_s"] for r in runs])),
    )


def render(res: dict[str, Any]) -> str:
    rows = [_row(label, runs, res["calls"]) for label, runs in res["runs"].items()]
    sync = res.get("sync") or []
    share = median([s["share"] for s in sync]) if sync else 0.0
    lines = [
        "## (i) Slow I/O in flight on one worker process: `-P asyncio` (issue 29)",
        "",
        f"{res['calls']:,} concurrent calls of an `async def` tool awaiting {res['seconds']:g} s "
        "(`sleep`: `asyncio.sleep`; `http`: a local HTTP provider answering after that "
        "long, through an `httpx.AsyncClient` per call) on ONE worker process, all queued "
        "before it starts; Celery's threads pool at the same `-c` beside it. "
        f"Medians of {res['repeats']} interleaved rounds (`python -m bench.aio_pool_bench`). "
        f"Targets: wall ≤ {TARGET_WALL_S:g} s, every call in flight at once, RSS ≤ "
        f"{TARGET_RSS_MB:g} MB. Wall: the first claim to the last record; RSS: the worker's "
        "most, sampled every 0.2 s; in flight: counted in the worker's memory (no round trip "
        "in the tool). The machine is shared (2 CPUs, other jobs running): the wall times "
        "are noisy.",
        "",
        report.table(HEADER, rows),
    ]
    lines += [
        "",
        "Where the wall time goes: past the 10 s of the tool, the calls reach it only as "
        "fast as the worker takes its messages and claims them (the column *first to last "
        "claim*), and their outcomes are recorded only as fast as the worker records them "
        "and runs Celery's tracer for each. The consumer takes up to 64 messages in one "
        "server call (``worker.fetch_batch``) and the loop claims and records in batches "
        "(what its calls ask while a round trip is out goes in the next), so the claims "
        "take well under a second; the calls then end within the same spread, and the "
        "rest of the wall is the loop's lateness in waking the last of them while it "
        "records the others and hands their tracers to threads (~1 ms of worker CPU a "
        "call in all, on one process's GIL). Holding the calls costs little: "
        "RSS stays under the target and every call that reached the tool stayed in "
        "flight on the one loop.",
    ]
    if sync:
        lines += [
            "",
            f"`def` tools on `-P asyncio -c 16` (the pool's threads): the 100 ms tool, "
            f"{fmt(median([s['rate'] for s in sync]))} calls/s of a 160/s ceiling = "
            f"**{share:.3f}** (target ≥ {TARGET_SHARE}; runs: "
            + ", ".join(f"{s['share']:.3f}" for s in sync)
            + ").",
        ]
    return "\n".join(lines)


def _stored() -> dict[str, Any]:
    """toolq's last stored run of this bench (``results/aio-pool.json``), if any."""
    path = report.RAW / "aio-pool.json"
    with contextlib.suppress(OSError, ValueError):
        stored: dict[str, Any] = json.loads(path.read_text())
        return stored
    return {}


def render_peers(res: dict[str, Any], toolq: dict[str, Any], same_run: bool = False) -> str:
    """The peers' rows, under toolq's rows at the same size (``toolq``: this run's, in
    the same interleaved rounds (``same_run``), or the table above's stored run)."""
    calls = res["calls"]
    ref = [
        _row(f"{label} (the table above)", runs, calls)
        for label, runs in (toolq.get("runs") or {}).items()
        if toolq.get("calls") == calls
    ]
    rows = [_row(label, runs, calls) for label, runs in res["runs"].items()]
    missing = res.get("missing") or []
    lines = [
        "## (i) saq and arq beside it: one worker process at the same concurrency (issue 29)",
        "",
        f"The loads of the table above ({calls:,} jobs of an `async def` function "
        f"awaiting `asyncio.sleep({res['seconds']:g})` (`sleep`), or a GET to the local "
        "provider answering after that long through an `httpx.AsyncClient` per call "
        "(`http`: the body of toolq's tool, `bench.peers.http_call`), all queued before the "
        f"worker starts) on ONE saq worker process at `concurrency={calls}` and ONE arq "
        f"worker process at `max_jobs={calls}`, their defaults otherwise but for saq's job "
        "timeout (300 s, arq's default; saq's, 10 s, is the call's own length) and its Redis "
        "client's connection bound (redis-py 5's, unbounded, as saq supports redis < 8 and "
        "arq's venv has 5: under redis-py 8's 100 saq's worker, one connection per waiting "
        f"dequeue, lost its process tasks to `MaxConnectionsError` at {calls:,}); on the "
        f"same embedded Valkey. Medians of {res['repeats']} interleaved rounds (`python -m "
        "bench.aio_pool_bench`); "
        + (
            "toolq's rows are from the same rounds. "
            if same_run
            else "toolq's rows are the table above's stored run, not re-run with them. "
        )
        + "*first sweep held off*: the bench "
        "takes saq's sweep lock before the worker starts, as if its sweep had just run; at "
        "the defaults the worker's first sweep, at start beside its first dequeues, aborts "
        "the jobs it finds taken but not yet written active (a round it caught shows in "
        "*succeeded*, or in a wall far past the sleep when one is run again). Wall: each "
        "system's own stamps, taken by its worker: saq's `started` "
        "(after the dequeue, before it writes the job active) to `completed` (before it "
        "writes the outcome), the same points as toolq's claim and record; arq's "
        "`start_time` (just before the function is called, after the pipeline that fetches "
        "the job) to `finish_time` (right after it returns, before the result is written), "
        "a little tighter than toolq's. *first to last claim*: to the last job's start "
        "stamp. In flight: counted in the worker's memory (`bench.peers.inflight`, as "
        "toolq's); RSS and CPU: the worker process's, as toolq's.",
        "",
        report.table(HEADER, ref + rows),
    ]
    if missing:
        lines += ["", f"Not run (not installed): {', '.join(missing)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.aio_pool_bench")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sync-calls", type=int, default=800)
    ap.add_argument(
        "--no-http",
        action="store_true",
        help="skip the scenarios that need the local HTTP provider (every *http*)",
    )
    ap.add_argument(
        "--scenarios",
        default=",".join(TOOLQ_SCENARIOS + DEFAULT_PEERS),
        help="comma-separated, of "
        + ",".join(TOOLQ_SCENARIOS + PEER_SCENARIOS)
        + " (default: all but saq at its defaults, whose first sweep can abort jobs it "
        "just took; saq and arq: a section of their own, beside toolq's rows of the same "
        "rounds, or its stored rows when none of toolq's is chosen); a peer not installed "
        "is reported, not run",
    )
    ap.add_argument("--serve-http", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve_http is not None:
        asyncio.run(_serve_http(a.serve_http))
        return 0
    chosen = tuple(x for x in a.scenarios.split(",") if x)
    unknown = set(chosen) - set(TOOLQ_SCENARIOS + PEER_SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    with server(a.redis_url, appendonly=False) as srv:
        res, peer_res = run(
            srv.url, a.calls, a.seconds, a.repeats, a.sync_calls, not a.no_http, chosen
        )
    if res is not None:
        report.update("aio-pool", render(res), res)
    if peer_res is not None:
        section = render_peers(peer_res, res or _stored(), same_run=res is not None)
        report.update("aio-pool-peers", section, peer_res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
