"""Chaos: the real system under kills, a server restart and duplicate deliveries.

    python -m bench.chaos --ops 2000 --kills 30        (python -m bench chaos does the same)
    python -m bench.chaos --ops 2000 --kills 30 --power-losses 4

Runs an embedded Valkey (AOF on, ``appendfsync always``), two calls workers
(prefork -c 3 and threads -c 4), a verify worker (prefork -c 2) and two
schedulers against the example invoice provider
(:mod:`toolq.examples.provider`, served from this process) with its faults
turned up: lost replies after commit, timeouts before commit, commits whose
reply never comes, rate limits, conflicts, a customer that is always down.
While operations are submitted it

* SIGKILLs a random worker every ``--interval`` seconds: a whole worker (its
  process group, then a new worker is started) or one prefork pool child
  (Celery starts another), and now and then a scheduler (started again);
* hard-restarts the server once, half way (SIGKILL; the AOF keeps every
  acknowledged write; same port, same data directory);
* or, with ``--power-losses N``, simulates N power losses instead, spread over
  the run: what a power loss does is drop the AOF's tail that was not fsynced.
  The size of the active AOF file (the incr file the manifest names) is
  sampled every 100 ms; the server is SIGKILLed, its AOF truncated to what a
  power loss would have kept, and started again (``aof-load-truncated yes``:
  it loads a file cut mid-command, as after a real power loss; the harness
  checks its log said so). With ``appendfsync everysec`` the fsync runs once a
  second, so the file is cut to its size of 1 s before the kill. With
  ``always`` every reply follows its fsync, so nothing a client was told can
  be lost and the file is kept whole: the run checks that toolq acts only on
  what was acknowledged (``TOOLQ_DURABILITY``, ``--durability``). Automatic
  AOF rewrites are off, so the sampled file is the one written to;
* pushes copies of queued messages (fresh and long stale) back into the
  calls and verify queues.

Then it stops the chaos, waits for the system to go quiet and compares the
ledger with the provider's own records. The provider runs *without* its
idempotency-key deduplication by default (``--dedup`` turns it on), so a
second committed side effect for one ``operation_ref`` cannot be hidden:
only toolq stands between a retry and a duplicate. It reports

* operations submitted, by final state;
* side effects (commits) per operation_ref: two or more is a failure;
* write requests that reached the provider per ref (a second request is
  legitimate only after verification found no commit, e.g. a timeout before
  commit);
* operations not in a final state once the system is quiet (failure);
* writes the ledger calls succeeded that the provider lacks, and the reverse
  (failures);
* time in pending recovery, p50/p95/max.

Lease 2 s and unclaimed_after 5 s (``TOOLQ_LEASE__SECONDS``,
``TOOLQ_RECOVERY__UNCLAIMED_AFTER``), visibility timeout 20 s (so Celery's
own redelivery of unacknowledged messages joins in), scheduler hold 5 s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import procs
from bench.common import percentile
from toolq.core.errors import ServerUnavailable
from toolq.core.keys import Keys

APP = "toolq.examples.invoices:tq"
TOOL = "create_invoice"
KEYS = Keys()  # the ledger keys of the default prefix the stack runs with
TERMINAL = {"succeeded", "failed", "escalated", "cancelled"}
RECOVERY = {"waiting_retry", "verifying", "awaiting_approval", "needs_input"}

#: Customers and their share of the operations; the provider picks a fault by customer.
MIX: tuple[tuple[str, float], ...] = (
    ("cust_ok", 0.58),
    ("cust_lostreply", 0.10),  # commits, then the reply is lost: verify finds it
    ("cust_slow_precommit", 0.07),  # times out before commit: verify, not found, retry
    ("cust_crash", 0.05),  # commits, reply held past the timeout: verify finds it
    ("cust_ratelimit", 0.12),  # 429 first: waiting_retry, the scheduler dispatches again
    ("cust_conflict", 0.04),  # 409: failed
    ("cust_down", 0.04),  # 503 every time: attempts exhausted, escalated
)

ENV = {
    "TOOLQ_LEASE__SECONDS": "2",
    "TOOLQ_RECOVERY__UNCLAIMED_AFTER": "5",
    "TOOLQ_QUEUES__VISIBILITY_TIMEOUT": "20",
    "TOOLQ_SCHEDULER__HOLD": "5",
    "TOOLQ_SCHEDULER__MAX_SLEEP": "1",
    "TOOLQ_EXAMPLE_PROVIDER_TIMEOUT": "2",
}


@dataclass
class ChaosConfig:
    ops: int = 2000
    kills: int = 30
    #: Seconds between kills; submissions are spread over kills x interval.
    interval: float = 3.0
    dup_every: float = 1.0
    restart_server: bool = True
    dedup: bool = False
    seed: int | None = None
    settle_timeout: float = 300.0
    redis_url: str | None = None
    appendfsync: str = "always"
    #: Simulated power losses (SIGKILL, AOF cut to its fsynced size, restart) instead
    #: of the one plain hard restart.
    power_losses: int = 0
    #: TOOLQ_DURABILITY for the client, workers and schedulers.
    durability: str = "fsync"
    verbose: bool = True

    @property
    def loss_window(self) -> float:
        """Seconds of AOF a power loss drops: what was written since the last fsync."""
        return 0.0 if self.appendfsync == "always" else 1.0


@dataclass
class Role:
    name: str
    kind: str  # calls | verify | scheduler | relay
    pool: str = ""
    concurrency: int = 0
    gen: int = 0
    child: procs.Child | None = None


@dataclass
class ChaosResult:
    submitted: int
    by_state: dict[str, int]
    kills: dict[str, int]
    server_restarts: int
    duplicate_pushes: int
    duplicates: dict[str, int]  # ref -> commits (and dedup replays), only refs with >= 2
    requests_per_ref: dict[int, int]  # requests -> number of refs
    multi_request_customers: dict[str, int]
    stuck: dict[str, str]  # ref -> state
    vanished: list[str]  # submitted (acknowledged), not in the ledger once quiet
    lost: list[str]  # ledger succeeded, provider has nothing
    phantom: dict[str, str]  # provider committed, ledger says otherwise (ref -> state)
    mismatched: list[str]  # ledger's invoice id is not the provider's
    recovery_ms: dict[str, float]
    recovered_ops: int
    ledger_stats: dict[str, int]
    log_errors: dict[str, int]
    unexpected_exits: list[str]
    seconds: float
    settled_after_s: float
    appendfsync: str
    dedup: bool
    seed: int | None = None
    durability: str = "fsync"
    #: One per simulated power loss: AOF sizes, bytes cut, whether the server said it
    #: loaded a truncated file.
    power_losses: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: A Cluster run's events (bench.cluster_chaos): failover, revive, slot migration.
    cluster: dict[str, Any] = field(default_factory=dict)
    #: An outage run's dependency outages and each process's resume (bench.outage_chaos).
    outages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.duplicates
            or self.stuck
            or self.vanished
            or self.lost
            or self.phantom
            or self.mismatched
        )

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ok"] = self.ok
        return d


class Chaos:
    """The single-server run; :mod:`bench.cluster_chaos` overrides the hooks marked so."""

    #: The kinds of kill and how often each is chosen.
    KILLS: dict[str, float] = {"worker": 0.25, "parent": 0.2, "pool_child": 0.3, "scheduler": 0.25}
    #: Process logs are under LOG_DIR/<DIR_PREFIX>-<time>-<run id>.
    DIR_PREFIX = "chaos"

    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        if cfg.seed is None:
            cfg.seed = random.SystemRandom().randrange(1 << 30)
        self.rng = random.Random(cfg.seed)
        self.run_id = uuid.uuid4().hex[:6]
        self.dir = f"{self.DIR_PREFIX}-{time.strftime('%H%M%S')}-{self.run_id}"
        (procs.LOG_DIR / self.dir).mkdir(parents=True, exist_ok=True)
        self.roles = [
            Role("calls-1", "calls", "prefork", 3),
            Role("calls-2", "calls", "threads", 4),
            Role("verify-1", "verify", "prefork", 2),
            Role("sched-1", "scheduler"),
            Role("sched-2", "scheduler"),
        ]
        self.kills: collections.Counter[str] = collections.Counter()
        self.server_restarts = 0
        self.dup_pushes = 0
        self.refs: list[str] = []
        self.customer: dict[str, str] = {}
        self.stop_chaos = threading.Event()
        self.lock = threading.Lock()
        self.notes: list[str] = []
        self.exits: list[str] = []
        #: Leaders killed alone: their orphaned pool children are reaped at the end.
        self.graveyard: list[procs.Child] = []
        self.server: Any = None
        self.provider: Any = None
        self.url = ""
        #: (monotonic time, active AOF file, its size), every ~100 ms.
        self.aof_sizes: collections.deque[tuple[float, Path, int]] = collections.deque(maxlen=100)
        self.power_losses: list[dict[str, Any]] = []

    def log(self, msg: str) -> None:
        if self.cfg.verbose:
            print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # ------------------------------------------------------------------ processes

    def env(self) -> dict[str, str]:
        assert self.provider is not None
        return {
            **self.client_env(),
            "TOOLQ_EXAMPLE_PROVIDER_URL": self.provider.url,
            "TOOLQ_DURABILITY": self.cfg.durability,
        }

    def spawn(self, role: Role) -> None:
        name = f"{self.dir}/{role.name}-g{role.gen}"
        if role.kind == "scheduler":
            role.child = procs.toolq_scheduler(name, APP, self.url, env=self.env())
        elif role.kind == "relay":
            argv = ["-m", "toolq.edges.cli", "relay", "--app", APP, "--redis-url", self.url]
            role.child = procs.python_child(name, [*argv, "--loglevel", "WARNING"], self.env())
        else:
            queue = "toolq.calls" if role.kind == "calls" else "toolq.verify"
            role.child = procs.toolq_worker(
                name,
                APP,
                self.url,
                pool=role.pool,
                concurrency=role.concurrency,
                queues=queue,
                env=self.env(),
                hostname=f"{role.name}-g{role.gen}@%h",
            )
        role.gen += 1

    def kill_one(self) -> None:
        workers = [r for r in self.roles if r.kind in ("calls", "verify")]
        what = self.rng.choices(list(self.KILLS), list(self.KILLS.values()))[0]
        if what == "parent":
            # Only the leader: its pool children are orphaned and finish what they hold.
            role = self.rng.choice(workers)
            assert role.child is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(role.child.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                role.child.proc.wait(timeout=10)
            self.graveyard.append(role.child)
            self.kills["parent"] += 1
            self.log(f"SIGKILL {role.name} leader only (pid {role.child.pid}); starting another")
            self.spawn(role)
            return
        if what == "pool_child":
            prefork = [r for r in workers if r.pool == "prefork" and r.child is not None]
            role = self.rng.choice(prefork)
            assert role.child is not None
            kids = role.child.descendants()
            if kids:
                pid = self.rng.choice(kids)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.kills["pool_child"] += 1
                self.log(f"SIGKILL pool child {pid} of {role.name}")
                return
            what = "worker"
        role = self.rng.choice(
            workers if what == "worker" else [r for r in self.roles if r.kind == what]
        )
        assert role.child is not None
        role.child.kill()
        self.kills[what] += 1
        self.log(f"SIGKILL {role.name} (pid {role.child.pid}, whole group); starting another")
        if what in ("scheduler", "relay"):
            time.sleep(self.rng.uniform(0.3, 1.5))
        self.spawn(role)

    def ensure_running(self) -> None:
        """Start again any process that exited on its own, as a supervisor would; note why."""
        for role in self.roles:
            if role.child is None or not role.child.alive():
                if role.child is not None:
                    code = role.child.proc.returncode
                    reason = next(
                        (
                            line.strip()
                            for line in reversed(role.child.tail(200).splitlines())
                            if "CRITICAL" in line or "Error" in line
                        ),
                        "",
                    )
                    self.exits.append(f"{role.name}-g{role.gen - 1} exit {code}: {reason[:200]}")
                    self.log(f"{role.name} exited on its own (exit {code}); starting another")
                self.spawn(role)

    # ------------------------------------------------------------------ threads

    def client(self) -> Any:
        """A client of the ledger's server (hook)."""
        return redis.Redis.from_url(self.url, socket_timeout=10, socket_connect_timeout=2)

    def queues_client(self) -> redis.Redis:
        """A client of the server holding Celery's queue lists (hook)."""
        return self.client()  # type: ignore[no-any-return]

    def op_key(self, ref: str) -> str:
        """The ledger key of operation ``ref`` (hook)."""
        return KEYS.op(ref)

    def read_stats(self, r: Any) -> dict[str, int]:
        """The ledger's counters (hook)."""
        return {k.decode(): int(v) for k, v in r.hgetall(KEYS.stats).items()}

    def submitter(self, tq: Any, seconds: float) -> None:
        t0 = time.monotonic()
        for i in range(self.cfg.ops):
            due = t0 + seconds * i / self.cfg.ops
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.submit_one(tq, i)

    def submit_one(self, tq: Any, i: int, patience: float = 120.0) -> None:
        """Submit operation ``i``, again with the same ref while the server is away."""
        customer = self.rng.choices([c for c, _ in MIX], [w for _, w in MIX])[0]
        ref = f"chaos-{self.run_id}-{i:05d}"
        args = {"customer": customer, "amount": round(self.rng.uniform(10, 5000), 2)}
        deadline = time.monotonic() + patience
        while True:
            try:
                tq.submit(TOOL, args, operation_ref=ref)
                break
            except (ServerUnavailable, redis.ConnectionError, redis.TimeoutError):
                # The server is restarting: submit again with the same ref (idempotent).
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with self.lock:
            self.refs.append(ref)
            self.customer[ref] = customer

    def duplicator(self) -> None:
        r = self.queues_client()
        captured: list[tuple[str, bytes]] = []
        n = 0
        try:
            while not self.stop_chaos.wait(self.cfg.dup_every):
                n += 1
                try:
                    for q in ("toolq.calls", "toolq.verify"):
                        msgs = r.lrange(q, 0, 9)
                        for m in self.rng.sample(msgs, min(2, len(msgs))):
                            r.lpush(q, m)
                            self.dup_pushes += 1
                            captured.append((q, m))
                    if n % 5 == 0 and captured:
                        for q, m in self.rng.sample(captured, min(3, len(captured))):
                            r.lpush(q, m)  # a stale copy: its attempt is long over
                            self.dup_pushes += 1
                    del captured[:-500]
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    continue
        finally:
            r.close()

    def wait_ready(self) -> None:
        """Give the processes just started time to start (hook)."""
        time.sleep(3.0)

    def duration(self) -> float:
        """Seconds over which operations are submitted and kills spread (hook)."""
        return max(self.cfg.kills * self.cfg.interval, self.cfg.ops / 50)

    def helpers(self) -> list[Callable[[], None]]:
        """What runs in threads beside the submitter until the chaos stops (hook)."""
        return [self.duplicator]

    def planned(self, start: float, seconds: float) -> list[tuple[float, str]]:
        """The server events of the run, (monotonic time, name), in order (hook)."""
        n = self.cfg.power_losses
        if self.server is not None and n:
            return [(start + seconds * (i + 1) / (n + 1), "power") for i in range(n)]
        if self.server is not None and self.cfg.restart_server:
            return [(start + seconds / 2, "restart")]
        return []

    def event(self, name: str) -> None:
        """Do the server event ``name`` of :meth:`planned` (hook)."""
        if name == "power":
            self.power_loss()
        else:
            self.log("hard restart of the server (SIGKILL; same port and data dir)")
            self.server.restart(hard=True)
            self.log("server is back")
        self.server_restarts += 1

    def chaos_loop(self, seconds: float) -> None:
        events = self.planned(time.monotonic(), seconds)
        kills_due = self.cfg.kills
        t_next = time.monotonic() + self.cfg.interval
        while (kills_due > 0 or events) and not self.stop_chaos.is_set():
            now = time.monotonic()
            if events and now >= events[0][0]:
                self.event(events.pop(0)[1])
            self.ensure_running()
            if kills_due > 0 and now >= t_next:
                self.kill_one()
                kills_due -= 1
                t_next = now + self.cfg.interval
            time.sleep(0.05)

    # ------------------------------------------------------------------ power loss

    def sample_aof(self) -> None:
        """Record the active AOF file's size every ~100 ms (what a power loss cuts back to)."""
        while not self.stop_chaos.wait(0.1):
            path = self.server.active_aof()
            with contextlib.suppress(OSError):
                if path is not None:
                    self.aof_sizes.append((time.monotonic(), path, path.stat().st_size))

    def power_loss(self) -> None:
        """SIGKILL the server, cut its AOF to what was fsynced, start it again."""
        server = self.server
        window = self.cfg.loss_window
        t_kill = time.monotonic()
        server.kill()
        path = server.active_aof()
        assert path is not None, "an AOF server without an incr file"
        size = path.stat().st_size
        if window <= 0:
            keep = size  # appendfsync always: every acknowledged write was fsynced
        else:
            # The latest size sampled at least `window` before the kill, of this file
            # (none: the file is newer than that, all of it came after the fsync) ...
            older = [n for t, p, n in self.aof_sizes if p == path and t <= t_kill - window]
            synced = older[-1] if older else 0
            # ... plus part of a page the disk was writing when the power went: samples
            # fall between whole writes, a power loss anywhere (mid-command, mid-MULTI).
            keep = min(size, synced + self.rng.randrange(4096))
        with open(path, "r+b") as fh:
            fh.truncate(keep)
        offset = server.log_path.stat().st_size
        server.start()
        with open(server.log_path, "rb") as fh:
            fh.seek(offset)
            started = fh.read().decode(errors="replace")
        loss = {
            "at_s": round(t_kill, 3),
            "aof_bytes": size,
            "kept_bytes": keep,
            "cut_bytes": size - keep,
            # "!!! Truncating the AOF ... at offset N !!!" / "... aof-load-truncated ..."
            "loaded_truncated": "Truncating the AOF" in started or "aof-load-truncated" in started,
        }
        self.power_losses.append(loss)
        self.log(
            f"power loss: server SIGKILLed, {path.name} cut from {size:,} to {keep:,} bytes "
            f"({window:g} s unsynced); back up"
            + (" (loaded a truncated AOF)" if loss["loaded_truncated"] else "")
        )

    # ------------------------------------------------------------------ the run

    def start_servers(self) -> None:
        """Start the ledger's server (or flush ``--redis-url``) and set :attr:`url` (hook)."""
        from toolq.adapters.embedded import EmbeddedServer

        cfg = self.cfg
        if cfg.redis_url:
            self.url = cfg.redis_url
            with contextlib.closing(self.client()) as r:
                r.flushdb()
        else:
            self.server = EmbeddedServer(
                appendonly=True,
                appendfsync=cfg.appendfsync,
                # a power loss loads what is left of a cut AOF (Valkey's default, said
                # aloud); no automatic rewrite, so the sampled incr file stays the one
                # written to
                extra_config={"aof-load-truncated": "yes", "auto-aof-rewrite-percentage": "0"},
            ).start()
            self.url = str(self.server.url)

    def stop_servers(self) -> None:
        """Stop what :meth:`start_servers` started (hook)."""
        if self.server is not None:
            self.server.stop()

    def client_env(self) -> dict[str, str]:
        """The settings of the processes, for this process's client too (hook)."""
        return dict(ENV)

    def run(self) -> ChaosResult:
        from toolq.examples.provider import InvoiceProvider, ProviderConfig

        cfg = self.cfg
        t_start = time.monotonic()
        self.start_servers()
        client_env = self.client_env()
        saved = {k: os.environ.get(k) for k in client_env}
        os.environ.update(client_env)  # the client's settings (unclaimed_after) match the workers'
        self.provider = InvoiceProvider(
            ProviderConfig(
                dedup=cfg.dedup, precommit_stall=3.0, crash_stall=5.0, latency=(0.02, 0.2)
            )
        ).start()
        from toolq.examples.invoices import tq

        # the client submits as durably as the workers claim
        tq.app.settings = tq.app.settings.model_copy(update={"durability": cfg.durability})
        tq.configure(redis_url=self.url)
        try:
            for role in self.roles:
                self.spawn(role)
            self.wait_ready()
            seconds = self.duration()
            self.log(
                f"seed {cfg.seed}: {cfg.ops} operations over {seconds:.0f} s, {cfg.kills} "
                f"kills; logs in "
                f"{procs.LOG_DIR / self.dir}"
            )
            threads = [
                threading.Thread(target=self.submitter, args=(tq, seconds), daemon=True),
                *(threading.Thread(target=t, daemon=True) for t in self.helpers()),
            ]
            if self.server is not None and cfg.power_losses:
                threads.append(threading.Thread(target=self.sample_aof, daemon=True))
            for t in threads:
                t.start()
            self.chaos_loop(seconds)
            threads[0].join()
            self.stop_chaos.set()
            for t in threads[1:]:
                t.join()
            self.ensure_running()
            chaos_s = time.monotonic() - t_start
            self.log(f"chaos over after {chaos_s:.0f} s; waiting for the system to go quiet")
            settled = self.settle()
            return self.verdict(chaos_s, settled)
        finally:
            self.stop_chaos.set()
            for role in self.roles:
                if role.child is not None:
                    role.child.stop(timeout=5)
            for child in self.graveyard:
                child.kill()
            tq.close()
            self.provider.stop()
            self.stop_servers()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def settle(self) -> float:
        t0 = time.monotonic()
        r = self.client()
        last: collections.Counter[str] = collections.Counter()
        try:
            while time.monotonic() - t0 < self.cfg.settle_timeout:
                try:
                    states = self.states(r)
                except redis.RedisError:
                    time.sleep(0.5)
                    continue
                last = collections.Counter(states.values())
                # an operation a power loss took away ("missing") will not come back
                if all(s in TERMINAL or s == "missing" for s in states.values()):
                    return time.monotonic() - t0
                self.ensure_running()
                time.sleep(1.0)
            self.log(f"not quiet after {self.cfg.settle_timeout:.0f} s: {dict(last)}")
            return time.monotonic() - t0
        finally:
            r.close()

    def states(self, r: redis.Redis) -> dict[str, str]:
        pipe = r.pipeline(transaction=False)
        for ref in self.refs:
            pipe.hget(self.op_key(ref), "state")
        return {
            ref: (s.decode() if s else "missing")
            for ref, s in zip(self.refs, pipe.execute(), strict=True)
        }

    # ------------------------------------------------------------------ the verdict

    def verdict(self, chaos_s: float, settled_s: float) -> ChaosResult:
        r = self.client()
        try:
            states = self.states(r)
            pipe = r.pipeline(transaction=False)
            for ref in self.refs:
                pipe.hgetall(self.op_key(ref))  # the envelope and the history (h1 .. h<hn>)
            raw = pipe.execute()
            stats = self.read_stats(r)
        finally:
            r.close()
        store = self.provider.store
        with store.lock:
            effects = collections.Counter(e["operation_ref"] for e in store.effects)
            replays = collections.Counter(e["operation_ref"] for e in store.replays)
            seen = dict(store.seen)
            by_ref = {k: list(v) for k, v in store.by_ref.items()}
        duplicates = {
            ref: effects[ref] + replays[ref]
            for ref in set(effects) | set(replays)
            if effects[ref] + replays[ref] >= 2
        }
        lost, mismatched = [], []
        phantom: dict[str, str] = {}
        recovery: list[float] = []
        for i, ref in enumerate(self.refs):
            fields = {k.decode(): v.decode() for k, v in raw[i].items()}
            hist = [json.loads(fields[f"h{n}"]) for n in range(1, int(fields.get("hn") or 0) + 1)]
            env = json.loads(fields["envelope"]) if fields.get("envelope") else {}
            state = states[ref]
            if state == "succeeded":
                if not effects[ref]:
                    lost.append(ref)
                else:
                    inv = (env.get("result") or {}).get("id")
                    if inv not in by_ref.get(ref, []):
                        mismatched.append(ref)
            elif effects[ref]:
                phantom[ref] = state
            spent = 0.0
            for a, b in itertools.pairwise(hist):
                if a["to"] in RECOVERY:
                    spent += b["at"] - a["at"]
            if spent > 0:
                recovery.append(spent)
        req = collections.Counter(seen.get(ref, 0) for ref in self.refs)
        multi = collections.Counter(
            self.customer[ref] for ref in self.refs if seen.get(ref, 0) >= 2
        )
        stuck = {ref: s for ref, s in states.items() if s not in TERMINAL and s != "missing"}
        vanished = [ref for ref, s in states.items() if s == "missing"]
        return ChaosResult(
            submitted=len(self.refs),
            by_state=dict(collections.Counter(states.values()).most_common()),
            kills=dict(self.kills),
            server_restarts=self.server_restarts,
            duplicate_pushes=self.dup_pushes,
            duplicates=duplicates,
            requests_per_ref=dict(sorted(req.items())),
            multi_request_customers=dict(multi.most_common()),
            stuck=stuck,
            vanished=vanished,
            lost=lost,
            phantom=phantom,
            mismatched=mismatched,
            recovery_ms={
                "p50": percentile(recovery, 50),
                "p95": percentile(recovery, 95),
                "max": max(recovery) if recovery else float("nan"),
            },
            recovered_ops=len(recovery),
            ledger_stats=_sum_stats(stats),
            log_errors=self.scan_logs(),
            unexpected_exits=self.exits,
            seconds=chaos_s,
            settled_after_s=settled_s,
            appendfsync=self.cfg.appendfsync if not self.cfg.redis_url else "(external)",
            dedup=self.cfg.dedup,
            seed=self.cfg.seed,
            notes=self.notes,
            durability=self.cfg.durability,
            power_losses=self.power_losses,
        )

    def scan_logs(self) -> dict[str, int]:
        out: collections.Counter[str] = collections.Counter()
        for path in (procs.LOG_DIR / self.dir).glob("*.log"):
            record = ""  # the log record a traceback belongs to
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("["):
                    record = line
                    if ": ERROR/" in line or ": CRITICAL/" in line:
                        out["ERROR lines"] += 1
                elif line.startswith("Traceback (most recent call last)"):
                    # A tool's or verifier's failure is logged with its traceback on purpose.
                    kind = "expected" if "failed for" in record else "unexpected"
                    out[f"tracebacks ({kind})"] += 1
                    record = record or line
        return dict(out)


def _sum_stats(stats: dict[str, int]) -> dict[str, int]:
    out: collections.Counter[str] = collections.Counter()
    for k, v in stats.items():
        out[k.split("|", 1)[-1]] += v
    return dict(sorted(out.items()))


def run(cfg: ChaosConfig) -> ChaosResult:
    return Chaos(cfg).run()


def summary(res: ChaosResult) -> str:
    lines = [
        f"operations submitted: {res.submitted}",
        f"  by final state: {res.by_state}",
        f"kills: {res.kills} (total {sum(res.kills.values())}); server restarts: "
        f"{res.server_restarts} ({len(res.power_losses)} power losses: "
        f"{[p['cut_bytes'] for p in res.power_losses]} bytes cut); duplicate messages "
        f"pushed: {res.duplicate_pushes}",
        f"side effects per operation_ref >= 2 (FAILURE): {len(res.duplicates)} "
        f"{dict(list(res.duplicates.items())[:10])}",
        f"write requests that reached the provider, per ref: {res.requests_per_ref} "
        f"(refs with >1 by customer: {res.multi_request_customers})",
        f"non-final after quiet (FAILURE): {len(res.stuck)} {dict(list(res.stuck.items())[:10])}",
        f"submitted, not in the ledger (FAILURE): {len(res.vanished)} {res.vanished[:10]}",
        f"ledger succeeded, provider lacks (FAILURE): {len(res.lost)} {res.lost[:10]}",
        f"provider committed, ledger not succeeded (FAILURE): {len(res.phantom)} "
        f"{dict(list(res.phantom.items())[:10])}",
        f"ledger's invoice id differs from the provider's (FAILURE): {len(res.mismatched)}",
        f"time in pending recovery ({res.recovered_ops} ops): p50 {res.recovery_ms['p50']:.0f} ms,"
        f" p95 {res.recovery_ms['p95']:.0f} ms, max {res.recovery_ms['max']:.0f} ms",
        f"ledger counters: {res.ledger_stats}",
        f"worker/scheduler logs: {res.log_errors}",
        f"processes that exited on their own (restarted): {len(res.unexpected_exits)} "
        f"{res.unexpected_exits}",
        f"chaos {res.seconds:.0f} s, quiet {res.settled_after_s:.0f} s later; appendfsync "
        f"{res.appendfsync}; durability {res.durability}; provider dedup "
        f"{'on' if res.dedup else 'off'}",
        "VERDICT: " + ("PASS" if res.ok else "FAIL"),
    ]
    lines += [f"note: {n}" for n in res.notes]
    return "\n".join(lines)


def kills_text(kills: dict[str, int]) -> str:
    """The kills of a run, by kind, as one table cell."""
    k = kills
    relays = f", relay {k['relay']}" if "relay" in k else ""
    return (
        f"{sum(k.values())}: whole worker {k.get('worker', 0)}, worker "
        f"leader only {k.get('parent', 0)}, pool child {k.get('pool_child', 0)}, scheduler "
        f"{k.get('scheduler', 0)}{relays}"
    )


def verdict_rows(res: ChaosResult, server_rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The rows of a run's section: what was done (``server_rows``: to the servers), then
    the verdict."""
    return [
        ("operations submitted", f"{res.submitted:,}"),
        ("by final state", ", ".join(f"{s} {n}" for s, n in res.by_state.items())),
        ("kills (SIGKILL)", kills_text(res.kills)),
        *server_rows,
        ("duplicate messages pushed into the queues", f"{res.duplicate_pushes:,}"),
        ("**refs with ≥ 2 committed side effects**", f"**{len(res.duplicates)}**"),
        (
            "write requests per ref (requests: refs)",
            ", ".join(f"{n}: {c}" for n, c in res.requests_per_ref.items()),
        ),
        (
            "refs with > 1 request, by customer",
            ", ".join(f"{c} {n}" for c, n in res.multi_request_customers.items()) or "none",
        ),
        ("**non-final after quiet**", f"**{len(res.stuck)}**"),
        ("**submitted, not in the ledger**", f"**{len(res.vanished)}**"),
        ("**ledger succeeded, provider lacks**", f"**{len(res.lost)}**"),
        ("**provider committed, ledger not succeeded**", f"**{len(res.phantom)}**"),
        ("ledger invoice id ≠ provider's", str(len(res.mismatched))),
        (
            "time in pending recovery p50 / p95 / max",
            f"{res.recovery_ms['p50']:,.0f} / {res.recovery_ms['p95']:,.0f} / "
            f"{res.recovery_ms['max']:,.0f} ms ({res.recovered_ops} ops)",
        ),
        ("ledger counters", ", ".join(f"{a} {b}" for a, b in res.ledger_stats.items())),
        (
            "tracebacks in process logs: tool failures (expected) / other; ERROR lines",
            f"{res.log_errors.get('tracebacks (expected)', 0)} / "
            f"{res.log_errors.get('tracebacks (unexpected)', 0)}; "
            f"{res.log_errors.get('ERROR lines', 0)}",
        ),
        (
            "processes that exited on their own (restarted by the harness)",
            str(len(res.unexpected_exits)) + "".join(f"<br>`{e}`" for e in res.unexpected_exits),
        ),
        ("chaos duration, then quiet after", f"{res.seconds:.0f} s, {res.settled_after_s:.0f} s"),
        ("verdict", "**PASS**" if res.ok else "**FAIL**"),
    ]


def render(res: ChaosResult, cfg: ChaosConfig) -> str:
    from bench.report import table

    server_rows = [
        (
            "server restarts (SIGKILL, AOF appendfsync " + res.appendfsync + ")",
            str(res.server_restarts),
        ),
        (
            "of which simulated power losses (AOF cut to its fsynced size)",
            f"{len(res.power_losses)}: "
            + (
                ", ".join(
                    f"{p['cut_bytes']:,} of {p['aof_bytes']:,} bytes cut"
                    + (" (loaded truncated)" if p["loaded_truncated"] else "")
                    for p in res.power_losses
                )
                or "-"
            ),
        ),
    ]
    power = f" --power-losses {cfg.power_losses}" if cfg.power_losses else ""
    fsync = "" if cfg.appendfsync == "always" else f" --appendfsync {cfg.appendfsync}"
    dur = "" if cfg.durability == "fsync" else f" --durability {cfg.durability}"
    title = "Chaos with simulated power losses" if cfg.power_losses else "Chaos"
    command = "python -m bench.chaos" if cfg.power_losses else "python -m bench chaos"
    return (
        f"## {title}\n\n"
        f"`{command} --ops {cfg.ops} --kills {cfg.kills}{power}{fsync}{dur}`: "
        f"embedded Valkey (AOF, `appendfsync {res.appendfsync}`, `TOOLQ_DURABILITY="
        f"{res.durability}`), calls workers prefork -c 3 and threads -c 4, a "
        "verify worker prefork -c 2, two schedulers; example invoice provider with "
        f"idempotency-key dedup **{'on' if res.dedup else 'off'}** (so every commit is a real "
        "side effect), faults: lost reply after commit, timeout before commit, reply held past "
        "the timeout, 429, 409, always-503. Lease 2 s, unclaimed_after 5 s, visibility "
        "timeout 20 s.\n\n" + table(("", ""), verdict_rows(res, server_rows)) + _power_note(res)
    )


def _power_note(res: ChaosResult) -> str:
    if not res.power_losses:
        return ""
    if res.appendfsync == "always":
        return (
            "\n\nA power loss keeps what was fsynced. With `appendfsync always` every reply "
            "follows its fsync, so each loss kept the whole file (0 bytes cut): nothing a "
            "worker or a caller was told is lost, and toolq acted only on what it was told "
            "(claims and submits confirmed with WAITAOF). With `--appendfsync everysec` the "
            "harness cuts the file to its size 1 s before each kill (plus part of a page, "
            "so the server loads a file cut mid-command): at 200 operations and 2 losses "
            "that run ends with writes done twice, acknowledged submits gone and commits the "
            "ledger does not know (23 / 34 / 21 for seed 126780545; tests/e2e/test_chaos.py)."
        )
    return (
        "\n\nEach loss cut the AOF to its size 1 s before the kill plus part of a page "
        "(what `appendfsync everysec` may not have fsynced)."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dedup", action="store_true", help="provider deduplicates by key")
    ap.add_argument("--no-restart", action="store_true", help="do not restart the server")
    ap.add_argument("--appendfsync", default="always", choices=("always", "everysec"))
    ap.add_argument(
        "--power-losses",
        type=int,
        default=0,
        help="simulated power losses (AOF cut to its fsynced size) instead of one restart",
    )
    ap.add_argument("--durability", default="fsync", choices=("fsync", "none"))
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--no-report", action="store_true", help="do not update RESULTS.md")
    ap.add_argument("--json", type=Path, default=None, help="write the result here as JSON")
    a = ap.parse_args(argv)
    cfg = ChaosConfig(
        ops=a.ops,
        kills=a.kills,
        interval=a.interval,
        seed=a.seed,
        dedup=a.dedup,
        restart_server=not a.no_restart,
        appendfsync=a.appendfsync,
        redis_url=a.redis_url,
        power_losses=a.power_losses,
        durability=a.durability,
    )
    res = run(cfg)
    print(summary(res))
    if a.json is not None:
        a.json.write_text(json.dumps(res.as_dict(), indent=1, default=str))
    if not a.no_report:
        from bench import report

        # the power-loss variant keeps a section of its own beside the plain run's
        name = "chaos-power" if cfg.power_losses else "chaos"
        report.update(name, render(res, cfg), res.as_dict())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
