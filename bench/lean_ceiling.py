"""The ceiling of a consumer of toolq's own on Celery's messages (issue 29, decision
0020's option 3): a bench-only prototype, not the product.

    python -m bench.lean_ceiling [--rounds 3] [--calls 2000] [--slots 16] [--backlog]
    python -m bench.lean_ceiling --serve --redis-url URL [--slots 16] [--inline-sync]
        [--coalesce-ms MS]                                              (the prototype)

**The prototype** (``--serve``): one process, one asyncio loop, no Celery worker. It
takes messages from toolq's queue lists with the transport's own fetch script
(:data:`toolq.adapters.broker.transport.FETCH_SCRIPT`: the same atomic move into kombu's
``unacked`` hash and index, the same delivery tags), after a BRPOP when the lists were
empty (the script then registers the BRPOP's message, as the transport does). It decodes
Celery's protocol-2 message (kombu's Redis envelope: base64 body, ``headers.task``) and
awaits toolq's real task bodies (``task.toolq_aio``, the asyncio pool's
:class:`~toolq.services.tasks.run_aio.AioRuntime`, built as the pool builds it) with
``--slots`` calls in flight and at most the pool's prefetch held (slots plus
``worker.reserve``): claim, record and the ledger's acknowledgement are exactly today's.
A ``def`` tool runs on the same bounded threads as on the pool. A body that could not
reach the ledger (``LedgerAway``/``RecordAway``: Celery's ``Requeue``) gives its delivery
back as kombu's reject with requeue does (``restore_by_tag(leftmost=True)``); a body that
raised otherwise is acknowledged (``task_acks_on_failure_or_timeout``); a message of
another task goes back to its queue's head untouched (a Celery worker runs it; alone, this
prototype would take it again). SIGTERM: no more fetches, the messages held and not
started go back to their queue's head, the calls in flight finish. It beats as a worker
(``toolq status``, the submitter's liveness check) with pool ``lean-prototype``.

Not there (what ``toolq worker --lean`` would need; decision 0020): Celery's remote
control, events, signals, ETA/expires/revoke, links, time limits, autoscale, reconnects.

**The bench**: in each round, on a fresh embedded Valkey (``appendfsync always``) with a
scheduler, (a) ``toolq worker -P asyncio -c 16`` (one process), (b) the prototype, and two
what-ifs of it ((c) a ``def`` tool run on its loop, ``--inline-sync``; (d) that and a
trickle of messages gathered ``--coalesce-ms`` before the script alone takes them),
interleaved; each warms with 300 calls, then ``--calls`` no-op calls are submitted from
the bench's process and each awaited (``tq.submit``, then ``tq.wait``), as ``python -m
bench.noop_cost`` and ``python -m bench peers`` do; ``--backlog``: the worker stopped
(SIGSTOP) while they are submitted, and measured draining them. CPU ms a call per process
from /proc: worker (and its busiest and main threads), server, submitter (this process),
scheduler; the server's BRPOP, EVALSHA and FCALL calls a call. Sections "lean-ceiling" and
"lean-ceiling-backlog" of RESULTS.md (``BENCH_OUT`` elsewhere for a trial run);
``BENCH_LEAN_PYSPY=DIR`` records the worker's measured section with py-spy (``--gil``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

log = logging.getLogger("bench.lean_ceiling")

#: The prototype's name in its beat (``toolq status``).
POOL = "lean-prototype"
#: How long a BRPOP waits before the loop looks again (the stop flag).
BRPOP_S = 1
#: (a) today's configured worker, (b) the prototype, (c) the prototype running a ``def``
#: tool on the loop itself (a what-if: no thread hop; unsafe for a tool that blocks).
#: (d) the prototype letting a trickle gather (``--coalesce-ms``) before the script alone
#: takes it, the ``def`` tool on its loop (what-ifs together: the best it did here).
VARIANTS = ("asyncio", "prototype", "prototype-inline", "prototype-best")
COALESCE_MS = 2.0


# ---------------------------------------------------------------- the prototype


class LeanConsumer:
    """One loop: fetch, decode, await the body, give back (the module's docstring)."""

    def __init__(
        self, tq: Any, slots: int, inline_sync: bool = False, coalesce_ms: float = 0.0
    ) -> None:
        from toolq.adapters.broker.ack import in_ledger
        from toolq.adapters.broker.consumer import prefetch_count, reserve_for
        from toolq.adapters.broker.messages import RUN_TASK, VERIFY_TASK
        from toolq.core.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX
        from toolq.services.tasks.celery import AioBodies

        self.tq = tq
        celery = tq.celery
        if not in_ledger(celery.conf):
            raise SystemExit("the prototype needs the ledger's server as the broker (redis://)")
        self.bodies: dict[str, AioBodies] = {}
        for name in (RUN_TASK, VERIFY_TASK):
            found = getattr(celery.tasks[name], "toolq_aio", None)
            assert isinstance(found, AioBodies)
            self.bodies[name] = found
        q = tq.settings.queues
        self.queues = [q.calls, q.verify]
        self.keys = [KOMBU_UNACKED, KOMBU_UNACKED_INDEX, *self.queues]
        self.slots_n = slots
        self.inline_sync = inline_sync
        self.coalesce_s = coalesce_ms / 1000
        self.sha = ""
        self.took = 0
        w = tq.settings.worker
        self.capacity = prefetch_count(slots, w.prefetch_multiplier, reserve_for(w.reserve, slots))
        self.fetch_batch = max(int(w.fetch_batch or 1), 1)
        self.held = 0
        self.waiting: dict[str, asyncio.Task[None]] = {}
        self.running: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.counts = {"ran": 0, "requeued": 0, "failed": 0, "foreign": 0, "fetches": 0}

    async def serve(self) -> None:
        import redis.asyncio as aredis

        from toolq.services.tasks.run_aio import AioRuntime
        from toolq.services.workers.aio_pool import MAX_THREADS, started_threads

        loop = asyncio.get_running_loop()
        threads = min(self.slots_n, MAX_THREADS)
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="lean-sync"
        )
        started_threads(self.executor, threads)
        aio = next(iter(self.bodies.values()))
        # As the asyncio pool builds it (AsyncioPool._runtime): one runtime for both tasks.
        self.rt = AioRuntime(aio.runtime(), aio.ledger(), self._blocking, renew=aio.ledger())
        self.slots = asyncio.Semaphore(self.slots_n)
        self.room = asyncio.Event()
        # No read timeout: redis-py's default (5 s) would end a BRPOP whose reply is on its
        # way (a process paused, a loop held), and the message the server popped is lost
        # (the scheduler publishes its operation again after recovery.unclaimed_after).
        self.fetcher = aredis.Redis.from_url(self.tq.redis_url, socket_timeout=None)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        beat = self._beat()
        try:
            await self._fetch_loop()
        finally:
            await self._drain()
            beat.stop()
            await self.rt.aclose()
            for ledger in (self.rt.ledger, self.rt.leases.ledger):
                with contextlib.suppress(Exception):
                    await ledger.redis.aclose()
            await self.fetcher.aclose()
            self.executor.shutdown(wait=True)
            log.warning("prototype stopped: %s", self.counts)

    def _stop(self) -> None:
        self.stopping = True
        self.room.set()

    def _beat(self) -> Any:
        from toolq.adapters.liveness import Heartbeat, WorkerNode

        app = self.tq.app
        app.ledger.record_cells()  # as run_worker does before it consumes
        keys = app.ledger.keys
        node = WorkerNode(
            node=f"lean@{socket.gethostname()}",
            pid=os.getpid(),
            pool=POOL,
            concurrency=self.slots_n,
            queues=tuple(self.queues),
            started_ms=int(time.time() * 1000),
        )
        hb = Heartbeat(
            lambda: app.redis,
            keys.workers,
            self.queues,
            every=self.tq.settings.worker.beat_s,
            node=node,
            nodes_key=keys.worker_nodes,
        )
        return hb.start()

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        if self.inline_sync:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    # ------------------------------------------------------------ fetching

    async def _fetch_loop(self) -> None:
        import redis

        while not self.stopping:
            try:
                await self._fetching()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # A prototype's reconnect (the pool makes a new connection): no Outage,
                # no backoff beyond this pause, no beat saying what it waits for.
                log.warning("fetch failed (%s); again", type(exc).__name__)
                await asyncio.sleep(0.1)

    async def _fetching(self) -> None:
        from toolq.adapters.broker.transport import FETCH_SCRIPT

        self.sha = await self.fetcher.script_load(FETCH_SCRIPT)
        backlog = False
        while not self.stopping:
            room = min(self.capacity - self.held, self.fetch_batch)
            if room <= 0:
                self.room.clear()
                await self.room.wait()
                continue
            if not backlog and self.coalesce_s:
                # What-if: let a trickle of messages gather, then the script alone takes
                # them (nothing out of the lists unregistered); a BRPOP only if none came.
                await asyncio.sleep(self.coalesce_s)
                backlog = await self._fetch(room, b"")
                if self.took:
                    continue
            item: Any = b""
            if not backlog:  # the lists were empty: wait for one message, as kombu's BRPOP
                got = await self.fetcher.brpop(self.queues, timeout=BRPOP_S)
                if not got:
                    continue
                item = got[1]
            backlog = await self._fetch(room, item)

    async def _fetch(self, room: int, item: bytes) -> bool:
        """The fetch script: registers ``item`` (a BRPOP's, b"": none) and takes up to
        ``room`` in all; starts what it took. Whether its list holds more."""
        from redis.exceptions import NoScriptError

        from toolq.adapters.broker.transport import FETCH_SCRIPT

        args = (room - 1 if item else room, repr(time.time()), item)
        try:
            reply = await self.fetcher.evalsha(self.sha, len(self.keys), *self.keys, *args)
        except NoScriptError:
            self.sha = await self.fetcher.script_load(FETCH_SCRIPT)
            reply = await self.fetcher.evalsha(self.sha, len(self.keys), *self.keys, *args)
        self.counts["fetches"] += 1
        registered, index, left, *taken = reply
        if item:
            if registered:
                taken.insert(0, item)
            else:  # no delivery tag: not a kombu message; kombu's path would meet it
                log.error("unregistered message left aside: %r", item[:200])
        self.took = len(taken)
        for raw in taken:
            self._start(raw)
        return bool(index) and bool(left)

    def _start(self, raw: bytes) -> None:
        from toolq.adapters.broker.transport import loads

        msg = loads(raw.decode())
        tag = str(msg["properties"]["delivery_tag"])
        self.held += 1
        task = asyncio.get_running_loop().create_task(self._handle(msg, tag))
        self.waiting[tag] = task

    # ------------------------------------------------------------ one delivery

    async def _handle(self, msg: dict[str, Any], tag: str) -> None:
        from toolq.services.tasks.run import LedgerAway, RecordAway

        task = asyncio.current_task()
        assert task is not None
        try:
            headers = msg.get("headers") or {}
            aio = self.bodies.get(headers.get("task", ""))
            if aio is None or msg.get("content-type") != "application/json":
                self.counts["foreign"] += 1
                self.waiting.pop(tag, None)
                await self._restore(tag, leftmost=False)  # a Celery worker's, untouched
                return
            args, kwargs, _embed = json.loads(base64.b64decode(msg["body"]))
            async with self.slots:
                self.waiting.pop(tag, None)
                self.running.add(task)
                try:
                    await aio.body(self.rt, tag, *args, **kwargs)
                    self.counts["ran"] += 1
                except (LedgerAway, RecordAway) as exc:  # Celery: Requeue, reject(requeue)
                    log.warning("requeued %s: %s", tag, exc)
                    self.counts["requeued"] += 1
                    await self._restore(tag, leftmost=True)
                except Exception:  # Celery: acks_on_failure_or_timeout
                    log.exception("task %s failed", headers.get("id"))
                    self.counts["failed"] += 1
                    await self.rt.ledger.ack(tag)
                finally:
                    self.running.discard(task)
        finally:
            self.waiting.pop(tag, None)
            self.held -= 1
            self.room.set()

    async def _restore(self, tag: str, *, leftmost: bool) -> None:
        """kombu's ``QoS.restore_by_tag``: the message out of ``unacked`` back onto its
        list, marked redelivered, in one transaction watched on ``unacked``."""
        from kombu.utils.json import dumps

        from toolq.adapters.broker.transport import loads

        unacked, index = self.keys[0], self.keys[1]
        async with self.fetcher.pipeline(transaction=True) as pipe:
            await pipe.watch(unacked)
            raw: Any = await pipe.hget(unacked, tag)
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.hdel(unacked, tag)
            pipe.zrem(index, tag)
            if raw:
                payload, _exchange, routing_key = loads(raw.decode())
                with contextlib.suppress(KeyError, TypeError):
                    payload["headers"]["redelivered"] = True
                    payload["properties"]["delivery_info"]["redelivered"] = True
                (pipe.lpush if leftmost else pipe.rpush)(routing_key, dumps(payload))
            await pipe.execute()

    async def _drain(self) -> None:
        """Warm stop: what is held and not started goes back to its queue's head; the
        calls in flight finish."""
        waiting = list(self.waiting.items())
        self.waiting.clear()
        for _, task in waiting:
            task.cancel()
        await asyncio.gather(*(t for _, t in waiting), return_exceptions=True)
        for tag, _ in reversed(waiting):
            with contextlib.suppress(Exception):
                await self._restore(tag, leftmost=False)
        if self.running:
            await asyncio.wait(list(self.running), timeout=60)


def serve(
    url: str, slots: int, app_path: str, inline_sync: bool = False, coalesce_ms: float = 0.0
) -> int:
    from toolq.edges.loader import load_app

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    tq = load_app(app_path, url)
    asyncio.run(LeanConsumer(tq, slots, inline_sync, coalesce_ms).serve())
    return 0


# ---------------------------------------------------------------- the bench


def one(calls: int, variant: str, slots: int, backlog: bool = False) -> dict[str, Any]:
    """One measured run of ``variant`` on a fresh server, in this process. ``backlog``: the
    worker stopped (SIGSTOP) while the calls are submitted, the rate from its SIGCONT."""
    from bench import procs
    from bench.clients import ToolqClient
    from bench.noop_cost import thread_cpu
    from bench.peers.toolq_peer import APP
    from bench.peers_bench import valkey

    with valkey(None, "always") as url:
        base = ["-m", "toolq.edges.cli"]
        sched = procs.python_child(
            f"lean-ceiling-scheduler-{variant}",
            [*base, "scheduler", "--app", APP, "--redis-url", url],
        )
        if variant == "asyncio":
            argv = [*base, "worker", "--app", APP, "--redis-url", url, "--pool", "asyncio"]
            argv += ["-c", str(slots)]
        else:
            argv = [str(HERE), "--serve", "--redis-url", url, "--slots", str(slots)]
            argv += ["--inline-sync"] if variant != "prototype" else []
            argv += ["--coalesce-ms", str(COALESCE_MS)] if variant == "prototype-best" else []
        worker = procs.python_child(f"lean-ceiling-worker-{variant}", argv)
        import redis

        c = redis.Redis.from_url(url)
        client = ToolqClient(url, "noop")
        try:
            warm = [client.submit(i) for i in range(300)]
            for ref in warm:
                client.wait(ref)
            server = int(c.info("server")["process_id"])
            me = os.getpid()
            cpu0 = {
                "worker": procs.group_cpu(worker),
                "server": procs.cpu_seconds(server),
                "submitter": procs.cpu_seconds(me),
                "scheduler": procs.group_cpu(sched),
            }
            threads0 = thread_cpu(worker.pid)
            k0 = c.info("commandstats")
            load1 = os.getloadavg()[0]
            spy = _py_spy(worker.pid, variant)
            t0 = time.perf_counter()
            if backlog:
                os.kill(worker.pid, signal.SIGSTOP)
            refs = [client.submit(i) for i in range(calls)]
            failed0 = client.failures
            if backlog:
                t0 = time.perf_counter()
                os.kill(worker.pid, signal.SIGCONT)
            for ref in refs:
                client.wait(ref)
            secs = time.perf_counter() - t0
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            cpu1 = {
                "worker": procs.group_cpu(worker),
                "server": procs.cpu_seconds(server),
                "submitter": procs.cpu_seconds(me),
                "scheduler": procs.group_cpu(sched),
            }
            threads1 = thread_cpu(worker.pid)
            k1 = c.info("commandstats")
            unacked = int(c.hlen("unacked"))
            alive = worker.alive()
        finally:
            worker.stop(timeout=10)
            sched.stop(timeout=10)
            client.close()
            c.close()
    out: dict[str, Any] = {
        "variant": variant,
        "rate": calls / secs,
        "failed": client.failures - failed0,
        "unacked_after": unacked,
        "worker_alive": alive,
        "load1": load1,
    }
    for k in cpu0:
        out[k] = (cpu1[k] - cpu0[k]) * 1000 / calls
    # By thread: the busiest (asyncio: the pool's loop; the prototype: its one loop), the
    # process's main thread (asyncio: Celery's consumer), the rest (sync tools' threads...).
    spent = {t: sum(v) - sum(threads0.get(t, (0.0, 0.0))) for t, v in threads1.items()}
    busiest = max(spent, key=lambda t: spent[t])
    out["worker busiest thread"] = spent[busiest] * 1000 / calls
    out["worker main thread"] = spent.get(worker.pid, 0.0) * 1000 / calls
    out["worker busiest is main"] = busiest == worker.pid
    for name in ("brpop", "evalsha", "fcall"):  # round trips the worker's side sends
        n = k1.get(f"cmdstat_{name}", {}).get("calls", 0) - k0.get(f"cmdstat_{name}", {}).get(
            "calls", 0
        )
        out[f"{name} a call"] = n / calls
    out["total"] = out["worker"] + out["server"] + out["submitter"]
    return out


#: A directory: py-spy (``--gil``) records the worker's measured section there.
PYSPY_ENV = "BENCH_LEAN_PYSPY"


def _py_spy(pid: int, variant: str) -> subprocess.Popen[bytes] | None:
    where = os.environ.get(PYSPY_ENV)
    if not where:
        return None
    out = Path(where) / f"{variant}-{pid}.txt"
    cmd = ["py-spy", "record", "--pid", str(pid), "--gil", "--format", "raw", "-o", str(out)]
    spy = subprocess.Popen([*cmd, "--rate", "250"], stdout=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the measured section
    return spy


def run_one(variant: str, calls: int, slots: int, backlog: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE), "--one", variant, "--calls", str(calls)]
    cmd += ["--slots", str(slots), *(["--backlog"] if backlog else [])]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(rounds: int, calls: int, slots: int, backlog: bool) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        for variant in VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]:
            up = os.getloadavg()
            row = {"round": r, "uptime_load": up, **run_one(variant, calls, slots, backlog)}
            rows.append(row)
            keep = ("variant", "round", "rate", "worker", "server", "submitter", "total")
            print(json.dumps({k: row[k] for k in keep}), flush=True)
    return {"rounds": rounds, "calls": calls, "slots": slots, "backlog": backlog, "rows": rows}


SECTION = {False: "lean-ceiling", True: "lean-ceiling-backlog"}
KEYS = ("rate", "total", "worker", "server", "submitter", "scheduler")


def render(res: dict[str, Any]) -> str:
    from bench.report import table

    present = [v for v in VARIANTS if any(x["variant"] == v for x in res["rows"])]
    by = {v: [x for x in res["rows"] if x["variant"] == v] for v in present}
    label = {
        "asyncio": f"`toolq worker -P asyncio -c {res['slots']}`",
        "prototype": f"prototype, {res['slots']} in flight",
        "prototype-inline": "prototype, `def` tool on the loop (what-if)",
        "prototype-best": f"the same, and a trickle gathered {COALESCE_MS:g} ms (what-if)",
    }

    def med(v: str, k: str) -> float:
        return float(statistics.median(x[k] for x in by[v]))

    rows = []
    for v in present:
        rows.append(
            (
                label[v],
                f"**{med(v, 'rate'):,.0f}**",
                f"**{med(v, 'total'):.3f}**",
                f"{med(v, 'worker'):.3f}",
                f"{med(v, 'worker busiest thread'):.3f} / {med(v, 'worker main thread'):.3f}",
                f"{med(v, 'server'):.3f}",
                f"{med(v, 'submitter'):.3f}",
                f"{med(v, 'scheduler'):.3f}",
            )
        )

    def each(v: str, k: str, fmt: str) -> str:
        return ", ".join(format(x[k], fmt) for x in by[v])

    per = "".join(
        f"{label[v]}: calls/s {each(v, 'rate', '.0f')}; worker ms {each(v, 'worker', '.3f')}; "
        + "".join(
            f"{k} {med(v, k):.2f}; "
            for k in ("brpop a call", "evalsha a call", "fcall a call")
            if all(k in x for x in by[v])
        )
        + f"failed {sum(x['failed'] for x in by[v])}, "
        f"left unacked {sum(x['unacked_after'] for x in by[v])}.\n"
        for v in present
    )
    loads = ", ".join(f"{x['uptime_load'][0]:.1f}" for x in res["rows"])
    if res.get("backlog"):
        title = ", the calls queued first"
        how = (
            f"the worker stopped (SIGSTOP) while {res['calls']:,} no-op calls are submitted, "
            "then resumed; calls/s from the resume to the last call awaited (the worker's "
            "drain: full fetches, claims and records in batches)"
        )
    else:
        title = ""
        how = (
            f"{res['calls']:,} no-op calls submitted from the bench's process, then each "
            "awaited (`tq.submit`, then `tq.wait`), the worker consuming meanwhile, as "
            "`python -m bench.noop_cost` and `python -m bench peers` do"
        )
    return (
        "## The ceiling of a consumer of toolq's own (issue 29, decision 0020 option 3)"
        + title
        + "\n\n"
        f"`python -m bench.lean_ceiling --rounds {res['rounds']} --calls {res['calls']} "
        f"--slots {res['slots']}" + (" --backlog`" if res.get("backlog") else "`") + ": "
        "one worker process on a fresh embedded Valkey each run (`appendfsync always`) with "
        "a scheduler: (a) toolq's configured worker; (b) the bench-only prototype in "
        "`bench/lean_ceiling.py` (one asyncio loop, no Celery worker: the transport's fetch "
        "script, Celery's protocol-2 message decoded, toolq's AioRuntime bodies: claim, "
        "record and the ledger's ack are today's; the `def` tool on the same bounded "
        "threads as the pool's); (c) the same running the `def` tool on its loop (a "
        "what-if: the thread hop's cost). Each run warms with 300 calls, then "
        + how
        + ". Rounds interleaved (the order rotates); medians; CPU ms a call per process "
        "from /proc (the scheduler apart, not in the total; busiest thread: the pool's or "
        "the prototype's loop, main thread: Celery's consumer on (a)).\n\n"
        + table(
            (
                "worker",
                "calls/s",
                "CPU ms a call",
                "worker",
                "· its busiest thread / main thread",
                "server",
                "submitter",
                "(scheduler)",
            ),
            rows,
        )
        + "\n\n"
        + per
        + f"load1 (uptime) before each run: {loads} (2 CPUs, shared with other work).\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lean_ceiling")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--serve", action="store_true", help="run the prototype consumer")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--app", default="bench.apps:tq")
    ap.add_argument("--backlog", action="store_true", help="all calls queued, then drained")
    ap.add_argument("--coalesce-ms", type=float, default=0.0, help="gather a trickle (what-if)")
    ap.add_argument("--inline-sync", action="store_true", help="def tools on the loop (what-if)")
    ap.add_argument("--one", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if ROOT.as_posix() not in sys.path:
        sys.path.insert(0, ROOT.as_posix())
    if a.serve:
        if not a.redis_url:
            ap.error("--serve needs --redis-url")
        return serve(a.redis_url, a.slots, a.app, a.inline_sync, a.coalesce_ms)
    if a.one is not None:
        print(json.dumps(one(a.calls, a.one, a.slots, a.backlog)))
        return 0
    from bench import report

    res = run(a.rounds, a.calls, a.slots, a.backlog)
    report.update(SECTION[a.backlog], render(res), res)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
