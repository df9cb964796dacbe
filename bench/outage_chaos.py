"""Chaos with dependency outages (issue 25): RabbitMQ, the ledger's server, a primary.

    python -m bench.outage_chaos                          single server + RabbitMQ
    python -m bench.outage_chaos --deployment cluster     Valkey Cluster + RabbitMQ
    python -m bench.outage_chaos --ops 40 --kills 1 --kill-kinds worker \\
        --outages rabbit:12,ledger:15 --gap 8 --warmup 5 --settle 60   (CI size)

bench.chaos's run (workers, schedulers, the faulty invoice provider without
deduplication, the verdict) in outbox mode with RabbitMQ as Celery's broker
(``tests.rabbit.RabbitServer``) and two relays, on one of two deployments:

* ``single``: the ledger on one embedded Valkey (AOF, ``appendfsync always``);
* ``cluster``: the ledger in 256 cells on a Valkey Cluster of 3 primaries with a
  replica each (bench.cluster_chaos's).

Beside the SIGKILLs of bench.chaos (workers, pool children, schedulers, relays;
none from a dependency's going down until 10 s after it answers again, so each
outage's figures are its own) it takes the dependencies away, one at a time,
with ``--gap`` seconds between one's return and the next's going:

* ``rabbit:S``: SIGKILL RabbitMQ's node, start it again S seconds later (same
  port, node name and data directory); ``rabbit-pause:S``: SIGSTOP it, SIGCONT;
* ``ledger:S``: SIGKILL the single server, start it again S seconds later (same
  port and data directory); ``ledger-pause:S``: SIGSTOP, SIGCONT;
* ``primary:S`` (cluster): SIGKILL a primary (its replica takes over), start it
  again S seconds later (it rejoins as a replica).

The verdict is bench.chaos's, plus two things no process may do:

* **exit on its own**: every process the harness started is polled
  (``Popen.poll``); one that exited without being killed by the harness is
  counted (and started again, as a supervisor would, so the books can settle);
* **resume late**: per outage, the seconds from the dependency answering again
  (RabbitMQ takes an AMQP connection; the server answers PING; the replica serves
  the slot) to each affected process's first sign of work: a worker's first call
  or check completed (its transition in the ledger's history, by its pid); a
  relay's first beat that counts more messages published (relays beat every 2 s
  and at once after an error, so this can be late by up to 2 s); a scheduler's
  first beat (every loop, at most 1 s apart here). A process with no such sign
  by the end is reported as "none". Target: 5 s.

Everything started is stopped at the end, on an exception, Ctrl-C or SIGTERM;
``--max-seconds`` bounds the chaos. Results: the ``outage`` / ``outage-cluster``
sections of bench/RESULTS.md and bench/results/<name>.json, or ``--json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import redis
from redis.cluster import key_slot

from bench import chaos, cluster_chaos, procs
from bench.chaos import ChaosConfig, ChaosResult, Role, summary
from bench.cluster_chaos import ClusterChaos
from tests.cluster import Cluster
from tests.rabbit import RabbitServer, _binary
from toolq.core.keys import Keys

#: Resume target (seconds from the dependency answering again).
TARGET_S = 5.0
#: No kill from a dependency's going down until this long after it answers again.
KILL_HOLD_S = 10.0
#: How often the watcher samples beats and process trees.
WATCH_EVERY_S = 0.25
#: Roles an outage of each dependency reaches (in outbox mode a scheduler never
#: talks to the broker).
AFFECTS = {
    "rabbit": ("calls", "verify", "relay"),
    "ledger": ("calls", "verify", "relay", "scheduler"),
    "primary": ("calls", "verify", "relay", "scheduler"),
}
#: Seconds a dependency takes to answer again once started (for planning only).
BOOT_S = {"rabbit": 8.0, "ledger": 1.0, "primary": 3.0}
SINGLE_OUTAGES = "rabbit:20,rabbit:120,ledger:60"
CLUSTER_OUTAGES = "rabbit:20,rabbit:120,primary:30"


@dataclass
class Outage:
    """One dependency taken away: what was planned, then what was measured."""

    kind: str  # rabbit | ledger | primary
    seconds: float
    pause: bool = False  # SIGSTOP/SIGCONT instead of SIGKILL and a new start
    down_at: float = 0.0  # wall-clock seconds
    #: When it answered again (wall clock); 0 while it has not.
    back_at: float = 0.0
    #: From starting it again (or SIGCONT) to its answering; the failover for a primary.
    boot_s: float = 0.0
    #: role -> seconds from back_at to its first sign of work (None: none seen).
    resume_s: dict[str, float | None] = field(default_factory=dict)
    #: role -> what the figure is ("call completed", "published", "beat").
    how: dict[str, str] = field(default_factory=dict)
    #: Workers with no sign because no work of theirs appeared after the return.
    idle: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind}{'-pause' if self.pause else ''}:{self.seconds:g}"

    @property
    def worst_s(self) -> float:
        vals = [
            math.inf if v is None else v for r, v in self.resume_s.items() if r not in self.idle
        ]
        return max(vals, default=0.0)


def parse_outages(spec: str) -> list[Outage]:
    """``rabbit:20,ledger-pause:60`` as outages."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        kind, _, secs = part.partition(":")
        pause = kind.endswith("-pause")
        kind = kind.removesuffix("-pause")
        if kind not in AFFECTS or not secs:
            raise ValueError(f"an outage is rabbit|ledger|primary[-pause]:SECONDS, not {part!r}")
        if kind == "primary" and pause:
            raise ValueError("a primary is killed, not paused")
        out.append(Outage(kind, float(secs), pause))
    return out


@dataclass
class OutageConfig:
    outages: list[Outage]
    #: Seconds from one dependency's answering again to the next one's going down.
    gap: float = 30.0
    #: Seconds of normal work before the first outage.
    warmup: float = 15.0
    #: A bound on the chaos (outages, kills, submissions); the settling has its own.
    max_seconds: float = 1800.0
    #: The kinds of kill in the rotation (bench.chaos's KILLS keys); empty: all.
    kill_kinds: tuple[str, ...] = ()


class OutageChaos(chaos.Chaos):
    """Single server + RabbitMQ (see the module docstring)."""

    KILLS = {"worker": 0.2, "parent": 0.15, "pool_child": 0.25, "scheduler": 0.2, "relay": 0.2}
    DIR_PREFIX = "outage"
    SECTION = "outage"

    def __init__(self, cfg: ChaosConfig, ocfg: OutageConfig) -> None:
        super().__init__(cfg)
        self.ocfg = ocfg
        if ocfg.kill_kinds:
            self.KILLS = {k: v for k, v in self.KILLS.items() if k in ocfg.kill_kinds}
        if not any(r.kind == "relay" for r in self.roles):
            self.roles += [Role("relay-1", "relay"), Role("relay-2", "relay")]
        self.rabbit: RabbitServer | None = None
        self.outages = ocfg.outages
        #: Set when the last outage's gap is over (or the chaos is cut short).
        self.script_done = threading.Event()
        #: No kill before this (monotonic): an outage and the 10 s after its end.
        self.hold_kills_until = 0.0
        #: pid -> role name, for every process (pool children too) seen in a role.
        self.pid_role: dict[int, str] = {}
        #: beat id -> [(at ms, published)] as sampled (relays), [(at ms, 0)] (schedulers).
        self.beats: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
        #: (wall time, role, exit code, reason) of each process that exited on its own.
        self.exit_events: list[tuple[float, str, int | None, str]] = []
        #: worker kind -> when work for it appeared (ms; from the ledger's histories).
        self.work_at: dict[str, list[int]] = collections.defaultdict(list)
        self.t0 = 0.0

    # ------------------------------------------------------------------ the deployment

    def start_rabbit(self) -> None:
        binary = _binary()
        if binary is None:
            raise SystemExit(
                "no rabbitmq-server: apt-get install rabbitmq-server, or set "
                "TOOLQ_RABBITMQ_SERVER=/path/to/it"
            )
        self.rabbit = RabbitServer(binary)
        began = time.monotonic()
        try:
            self.rabbit.start()
            self.prime_rabbit()
        except BaseException:
            self.rabbit.stop()
            self.rabbit = None
            raise
        self.log(
            f"RabbitMQ up on port {self.rabbit.port}, queues declared and the node restarted, "
            f"in {time.monotonic() - began:.1f} s"
        )

    def prime_rabbit(self) -> None:
        """Declare toolq's queues, then restart the node gracefully. RabbitMQ keeps its
        quorum queues' registry in a DETS table saved every 3 minutes: a node SIGKILLed
        sooner after a queue's declaration comes back without the queue's member, which
        then never gets a leader (publishes nacked after ~60 s, consumers closed with 541
        INTERNAL_ERROR; seen here with 3.10.8). A broker up for minutes has saved it."""
        from kombu import Connection

        from toolq.adapters.broker.app import queue_for

        assert self.rabbit is not None
        url = self.rabbit.url
        with Connection(url, connect_timeout=5) as conn:
            for name in ("toolq.calls", "toolq.verify"):
                queue_for(name, url)(conn.default_channel).declare()
        self.rabbit.stop_node()
        self.rabbit.start()

    def start_servers(self) -> None:
        self.start_rabbit()
        try:
            super().start_servers()
        except BaseException:
            self.stop_servers()
            raise

    def stop_servers(self) -> None:
        try:
            super().stop_servers()
        finally:
            if self.rabbit is not None:
                self.rabbit.stop_node()
                with contextlib.suppress(OSError):  # its logs beside the processes'
                    shutil.copytree(self.rabbit.dir / "log", procs.LOG_DIR / self.dir / "rabbitmq")
                self.rabbit.stop()
                self.rabbit = None

    def client_env(self) -> dict[str, str]:
        assert self.rabbit is not None
        return {
            **chaos.ENV,
            "TOOLQ_BROKER_URL": self.rabbit.url,
            "TOOLQ_RELAY__CLAIM_AFTER": "5",
        }

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker, relay and scheduler has beaten (a worker beats once it is
        connected to the broker)."""
        kinds = collections.Counter(r.kind for r in self.roles)
        want = (kinds["calls"] + kinds["verify"], kinds["relay"], kinds["scheduler"])
        keys = self.beat_keys()
        deadline = time.monotonic() + timeout
        with contextlib.closing(self.watch_client()) as r:
            while True:
                self.ensure_running()
                try:
                    pipe = r.pipeline(transaction=False)
                    for key in (keys.worker_nodes, keys.relays, keys.schedulers):
                        pipe.hlen(key)
                    have = tuple(pipe.execute())
                except redis.RedisError:
                    have = (0, 0, 0)
                if all(h >= w for h, w in zip(have, want, strict=True)):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready in {timeout:.0f} s: {have} of {want}")
                time.sleep(0.2)

    def watch_client(self) -> Any:
        """The watcher's client of the ledger: short timeouts (a paused server)."""
        return redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)

    def beat_keys(self) -> Keys:
        return chaos.KEYS

    # ------------------------------------------------------------------ the schedule

    def duration(self) -> float:
        o = self.ocfg
        return o.warmup + sum(x.seconds + BOOT_S[x.kind] + o.gap for x in self.outages)

    def helpers(self) -> list[Callable[[], None]]:
        # no duplicate pushes: the queues are RabbitMQ's (bench.chaos covers those)
        return [self.watch]

    def submitter(self, tq: Any, seconds: float) -> None:
        """Submit at the planned pace until the last outage's gap is over."""
        every = seconds / max(self.cfg.ops, 1)
        longest = max((o.seconds for o in self.outages), default=0.0)
        i = 0
        t0 = time.monotonic()
        while not self.script_done.is_set():
            delay = t0 + i * every - time.monotonic()
            if delay > 0 and self.script_done.wait(delay):
                break
            self.submit_one(tq, i, patience=longest + 120)
            i += 1

    def chaos_loop(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        script = threading.Thread(target=self.script, daemon=True)
        script.start()
        kills_due = self.cfg.kills
        interval = seconds / (kills_due + 1) if kills_due else math.inf
        t_next = self.t0 + interval
        bound = self.t0 + self.ocfg.max_seconds
        try:
            while script.is_alive() or kills_due > 0:
                now = time.monotonic()
                if now > bound:
                    self.notes.append(f"chaos cut short at --max-seconds {self.ocfg.max_seconds}")
                    self.log("max seconds reached: ending the chaos")
                    break
                self.ensure_running()
                if not script.is_alive() and interval > 2.0:
                    # the kills still due once the outages are over come now, 2 s apart
                    interval, t_next = 2.0, min(t_next, now)
                if kills_due > 0 and now >= t_next and now >= self.hold_kills_until:
                    self.kill_one()
                    kills_due -= 1
                    t_next = now + interval
                time.sleep(0.05)
        finally:
            self.script_done.set()
            script.join(timeout=180)

    def script(self) -> None:
        """The outages, one after another (its own thread: kills go on meanwhile)."""
        try:
            if self.script_done.wait(self.ocfg.warmup):
                return
            for o in self.outages:
                self.take_down(o)
                if self.script_done.wait(o.seconds):
                    self.bring_back(o)
                    return
                self.bring_back(o)
                if self.script_done.wait(self.ocfg.gap):
                    return
        except Exception as exc:
            self.notes.append(f"outage script failed: {type(exc).__name__}: {exc}")
            self.log(f"outage script failed: {exc!r}")
        finally:
            self.hold_kills_until = 0.0
            self.script_done.set()

    def take_down(self, o: Outage) -> None:
        self.hold_kills_until = math.inf  # until bring_back sets it
        o.down_at = time.time()
        how = "SIGSTOP" if o.pause else "SIGKILL"
        if o.kind == "rabbit":
            assert self.rabbit is not None
            (self.rabbit.pause if o.pause else self.rabbit.kill)()
            self.log(f"{o.name}: RabbitMQ {how}")
        elif o.kind == "ledger":
            if o.pause:
                os.kill(self.server.pid, signal.SIGSTOP)
            else:
                self.server.kill()
            self.log(f"{o.name}: the ledger's server {how}")
        else:
            self.kill_primary(o)

    def bring_back(self, o: Outage) -> None:
        began = time.monotonic()
        if o.kind == "rabbit":
            assert self.rabbit is not None
            (self.rabbit.resume if o.pause else self.rabbit.start)()
            o.back_at = time.time()
            o.boot_s = time.monotonic() - began
        elif o.kind == "ledger":
            if o.pause:
                os.kill(self.server.pid, signal.SIGCONT)
                self.wait_ledger()
            else:
                self.server.start()
            o.back_at = time.time()
            o.boot_s = time.monotonic() - began
        else:
            self.revive_primary(o)
        self.hold_kills_until = time.monotonic() + KILL_HOLD_S
        again = "SIGCONT" if o.pause else "it was started again"
        self.log(f"{o.name}: answering again ({o.boot_s:.1f} s after {again})")

    def wait_ledger(self, timeout: float = 30.0) -> None:
        """Until the ledger's server answers PING."""
        with contextlib.closing(self.watch_client()) as r:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if r.ping():
                        return
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.05)

    def kill_primary(self, o: Outage) -> None:
        raise ValueError("a primary outage needs --deployment cluster")

    def revive_primary(self, o: Outage) -> None:
        raise ValueError("a primary outage needs --deployment cluster")

    # ------------------------------------------------------------------ watching

    def ensure_running(self) -> None:
        for role in self.roles:
            child = role.child
            if child is not None and not child.alive():
                code = child.proc.returncode
                reason = next(
                    (
                        line.strip()
                        for line in reversed(child.tail(200).splitlines())
                        if "CRITICAL" in line or "Error" in line
                    ),
                    "",
                )
                self.exit_events.append((time.time(), f"{role.name}-g{role.gen - 1}", code, reason))
        super().ensure_running()

    def watch(self) -> None:
        """Sample, until the chaos ends, which pids each role has and every beat."""
        r = self.watch_client()
        keys = self.beat_keys()
        try:
            while not self.stop_chaos.wait(WATCH_EVERY_S):
                self.sample_pids()
                try:
                    pipe = r.pipeline(transaction=False)
                    pipe.hgetall(keys.relays)
                    pipe.hgetall(keys.schedulers)
                    relays, schedulers = pipe.execute()
                except redis.RedisError:
                    continue
                for rid, raw in relays.items():
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        beat = json.loads(raw)
                        self.note_beat(_s(rid), int(beat["at"]), int(beat["published"]))
                for sid, ms in schedulers.items():
                    with contextlib.suppress(ValueError):
                        self.note_beat(_s(sid), int(ms), 0)
        finally:
            r.close()

    def sample_pids(self) -> None:
        for role in self.roles:
            child = role.child
            if child is not None and child.alive():
                for pid in [child.pid, *child.descendants()]:
                    self.pid_role[pid] = role.name

    def note_beat(self, bid: str, at: int, published: int) -> None:
        seen = self.beats[bid]
        if not seen or seen[-1] != (at, published):
            seen.append((at, published))

    # ------------------------------------------------------------------ the verdict

    def verdict(self, chaos_s: float, settled_s: float) -> ChaosResult:
        self.sample_pids()
        res = super().verdict(chaos_s, settled_s)
        calls = self.completed_calls()
        for o in self.outages:
            if o.back_at:
                self.measure(o, calls)
        ends = [o.down_at or math.inf for o in self.outages[1:]] + [math.inf]
        res.outages = [self.outage_dict(o, end) for o, end in zip(self.outages, ends, strict=True)]
        return res

    def completed_calls(self) -> dict[str, list[int]]:
        """role -> the times (ms) its processes completed a call or a check."""
        r = self.client()
        try:
            pipe = r.pipeline(transaction=False)
            for ref in self.refs:
                pipe.hgetall(self.op_key(ref))
            raw = pipe.execute()
        finally:
            r.close()
        out: dict[str, list[int]] = collections.defaultdict(list)
        for rec in raw:
            fields = {_s(k): _s(v) for k, v in rec.items()}
            for n in range(1, int(fields.get("hn") or 0) + 1):
                entry = json.loads(fields[f"h{n}"])
                # work for a worker of that kind: a call queued, a check due
                kind = {"queued": "calls", "verifying": "verify"}.get(entry.get("to", ""))
                if kind is not None:
                    self.work_at[kind].append(int(entry["at"]))
                # a call's outcome (from running) or a check's verdict (from verifying)
                if entry.get("from") not in ("running", "verifying"):
                    continue
                role = self.pid_role.get(_pid(str(entry.get("by", ""))))
                if role is not None:
                    out[role].append(int(entry["at"]))
        return {k: sorted(v) for k, v in out.items()}

    def measure(self, o: Outage, calls: dict[str, list[int]]) -> None:
        back_ms = int(o.back_at * 1000)
        down_ms = int(o.down_at * 1000)
        affected = AFFECTS[o.kind]
        for role in self.roles:
            if role.kind not in affected:
                continue
            first: int | None = None
            if role.kind in ("calls", "verify"):
                how = "first call completed" if role.kind == "calls" else "first check completed"
                first = next((t for t in calls.get(role.name, []) if t >= back_ms), None)
                if first is None and not any(t >= back_ms for t in self.work_at[role.kind]):
                    o.idle.append(role.name)
            elif role.kind == "relay":
                how = "first beat with more published"
                for bid, seen in self.beats.items():
                    if self.pid_role.get(_pid(bid)) != role.name:
                        continue
                    before = max((p for at, p in seen if at <= down_ms), default=0)
                    t = next((at for at, p in seen if at >= back_ms and p > before), None)
                    if t is not None and (first is None or t < first):
                        first = t
            else:
                how = "first beat"
                for bid, seen in self.beats.items():
                    if self.pid_role.get(_pid(bid)) != role.name:
                        continue
                    t = next((at for at, _ in seen if at >= back_ms), None)
                    if t is not None and (first is None or t < first):
                        first = t
            o.resume_s[role.name] = None if first is None else round((first - back_ms) / 1000, 2)
            o.how[role.name] = how

    def outage_dict(self, o: Outage, end: float) -> dict[str, Any]:
        """``o`` as a dict, with the exits from its start to the next outage's (``end``)."""
        d = asdict(o)
        d["name"] = o.name
        d["worst_s"] = None if math.isinf(o.worst_s) else o.worst_s
        d["exits"] = [
            {"at_s": round(at - o.down_at, 1), "process": who, "code": code, "reason": why[:200]}
            for at, who, code, why in self.exit_events
            if o.down_at <= at < end
        ]
        return d


class ClusterOutageChaos(OutageChaos, ClusterChaos):
    """Valkey Cluster + RabbitMQ (see the module docstring)."""

    DIR_PREFIX = "cluster-outage"
    SECTION = "outage-cluster"

    def __init__(self, cfg: ChaosConfig, ocfg: OutageConfig) -> None:
        super().__init__(cfg, ocfg)
        self.victim: Any = None

    def start_servers(self) -> None:
        self.start_rabbit()
        try:
            self.cluster = Cluster(primaries=3, replicas=1).start()
            self.url = f"redis://127.0.0.1:{self.cluster.nodes[0].port}"
            self.log(f"cluster of 6 nodes up in {self.cluster.start_seconds:.1f} s")
        except BaseException:
            self.stop_servers()
            raise

    def client_env(self) -> dict[str, str]:
        assert self.rabbit is not None
        return {**cluster_chaos.ENV, "TOOLQ_BROKER_URL": self.rabbit.url}

    def watch_client(self) -> Any:
        assert self.cluster is not None
        return self.cluster.client(
            decode_responses=False, socket_timeout=1, socket_connect_timeout=1
        )

    def beat_keys(self) -> Keys:
        return Keys(cluster_chaos.PREFIX)

    def kill_primary(self, o: Outage) -> None:
        cluster = self.cluster
        assert cluster is not None
        startup = cluster.nodes[0]
        cells = self.rng.sample(range(cluster_chaos.CELLS), cluster_chaos.CELLS)
        slot = next(
            key_slot(Keys(cluster_chaos.PREFIX, c).due.encode())
            for c in cells
            if cluster.owner(key_slot(Keys(cluster_chaos.PREFIX, c).due.encode())) is not startup
        )
        self.victim, took = cluster.kill_primary(slot)
        o.back_at = time.time()  # the replica serves the slot: the ledger answers again
        o.boot_s = round(took, 2)
        o.detail = f"primary {self.victim.port} SIGKILLed; its replica took over in {took:.1f} s"
        self.log(f"{o.name}: {o.detail}")
        self.hold_kills_until = time.monotonic() + KILL_HOLD_S

    def revive_primary(self, o: Outage) -> None:
        assert self.cluster is not None
        self.cluster.revive(self.victim)
        o.detail += "; revived as a replica"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pid(ident: str) -> int:
    """The pid in a process id ``host:pid:token[...]`` (0 for anything else)."""
    parts = ident.split(":")
    try:
        return int(parts[1]) if len(parts) >= 3 else 0
    except ValueError:
        return 0


# ---------------------------------------------------------------------- the report


def verdict(res: ChaosResult) -> dict[str, Any]:
    """The four counts and the slowest resume; ``ok`` when all meet the target."""
    lost = len(res.lost) + len(res.vanished)
    worst = [o["worst_s"] for o in res.outages]
    slowest = None if any(w is None for w in worst) else max(worst, default=0.0)
    counts = {
        "duplicates": len(res.duplicates),
        "lost": lost,
        "stuck": len(res.stuck),
        "exited_on_their_own": len(res.unexpected_exits),
        "slowest_resume_s": slowest,
    }
    resumed = slowest is not None and slowest <= TARGET_S
    ok = res.ok and not res.unexpected_exits and resumed and bool(res.outages)
    return {**counts, "ok": ok}


def outage_summary(res: ChaosResult) -> str:
    v = verdict(res)
    lines = [summary(res), "", "outages (resume: seconds from the dependency answering again):"]
    for o in res.outages:
        figures = ", ".join(
            f"{role} {'idle' if role in o.get('idle', ()) else 'none' if s is None else f'{s:.1f}'}"
            for role, s in o["resume_s"].items()
        )
        lines.append(
            f"  {o['name']}: back {o['boot_s']:.1f} s after its start (or SIGCONT); {figures}"
            + (f" ({o['detail']})" if o["detail"] else "")
        )
        lines += [
            f"    exited {e['at_s']:+.0f} s: {e['process']} (code {e['code']}) {e['reason']}"
            for e in o["exits"]
        ]
    lines.append(
        f"OUTAGE VERDICT: duplicates {v['duplicates']}, lost {v['lost']}, stuck {v['stuck']}, "
        f"exited on their own {v['exited_on_their_own']}, slowest resume "
        f"{'none' if v['slowest_resume_s'] is None else v['slowest_resume_s']} s "
        f"(target {TARGET_S:g}): {'PASS' if v['ok'] else 'FAIL'}"
    )
    return "\n".join(lines)


def render(res: ChaosResult, cfg: ChaosConfig, ocfg: OutageConfig, deployment: str) -> str:
    from bench.report import table

    v = verdict(res)
    roles = list(dict.fromkeys(r for o in res.outages for r in o["resume_s"]))
    rows = []
    for o in res.outages:
        cells = [
            "-"
            if r not in o["resume_s"]
            else "idle"
            if r in o.get("idle", ())
            else ("**none**" if o["resume_s"][r] is None else _mark(o["resume_s"][r]))
            for r in roles
        ]
        rows.append((f"`{o['name']}`", f"{o['boot_s']:.1f}", *cells, len(o["exits"])))
    where = (
        "the ledger on one embedded Valkey (AOF, `appendfsync always`)"
        if deployment == "single"
        else "the ledger in 256 cells on a Valkey Cluster of 3 primaries with a replica each"
    )
    exits = "".join(f"<br>{line}" for line in exits_by_reason(res.unexpected_exits))
    head = [
        ("operations submitted", f"{res.submitted:,}"),
        ("by final state", ", ".join(f"{s} {n}" for s, n in res.by_state.items())),
        ("kills (SIGKILL)", chaos.kills_text(res.kills)),
        ("**refs with ≥ 2 committed side effects**", f"**{v['duplicates']}**"),
        ("**lost** (submitted and gone, or succeeded without a commit)", f"**{v['lost']}**"),
        ("**stuck** (not final once quiet)", f"**{v['stuck']}**"),
        ("provider committed, ledger not succeeded", str(len(res.phantom))),
        ("**processes that exited on their own**", f"**{v['exited_on_their_own']}**{exits}"),
        (
            "**slowest resume** (target ≤ 5 s)",
            "**none**" if v["slowest_resume_s"] is None else f"**{v['slowest_resume_s']:.1f} s**",
        ),
        ("chaos, then quiet after", f"{res.seconds:.0f} s, {res.settled_after_s:.0f} s"),
        ("verdict", "**PASS**" if v["ok"] else "**FAIL**"),
    ]
    flag = "" if deployment == "single" else " --deployment cluster"
    spec = ",".join(o["name"] for o in res.outages)
    kinds = f" --kill-kinds {','.join(ocfg.kill_kinds)}" if ocfg.kill_kinds else ""
    title = "single server + RabbitMQ" if deployment == "single" else "Cluster + RabbitMQ"
    return (
        f"### Outages: {title}\n\n"
        f"`python -m bench.outage_chaos{flag} --ops {cfg.ops} --kills {cfg.kills}{kinds} "
        f"--outages {spec} --gap {ocfg.gap:g} --warmup {ocfg.warmup:g}`: {where}; RabbitMQ "
        "as Celery's broker (outbox mode, two relays); calls workers prefork -c 3 and threads "
        "-c 4, a verify worker prefork -c 2, two schedulers; the invoice provider without "
        "deduplication and with its faults (as in Chaos). Kills are held from an outage's "
        "start to 10 s after its end.\n\n"
        + table(("", ""), head)
        + "\n\nResume, in seconds from the dependency answering again to each process's first "
        "call or check completed (workers), first beat with more messages published (relays; "
        "≤ 2 s late) or first beat (schedulers); **none**: no sign by the end of the run; idle: no "
        "work for it appeared after the return; "
        "`-`: not affected (a scheduler never talks to the broker). A process that exited "
        "on its own was started again by the harness, as a supervisor would: its figure is "
        "then its successor's.\n\n"
        + table(("outage", "back after start (s)", *roles, "exits"), rows)
    )


def exits_by_reason(exits: list[str]) -> list[str]:
    """``relay-1-g3 exit 1: why`` lines as one line per reason: how many, of which role."""
    by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for e in exits:
        who, _, why = e.partition(": ")
        by[why or "?"][who.split(" exit ")[0].rsplit("-g", 1)[0]] += 1
    return [
        ", ".join(f"{role} x{n}" for role, n in sorted(roles.items())) + f": `{why}`"
        for why, roles in by.items()
    ]


def _run_args(argv: list[str]) -> list[str]:
    """The options that shaped a run (what --render needs), without where it wrote."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--json", "--replay", "--render"):
            skip = True
        elif x != "--no-report" and not x.startswith(("--json=", "--replay=", "--render=")):
            out.append(x)
    return out


def _mark(s: float) -> str:
    return f"**{s:.1f}**" if s > TARGET_S else f"{s:.1f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="python -m bench.outage_chaos", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--deployment", default="single", choices=("single", "cluster"))
    ap.add_argument("--outages", default=None, help=f"default: {SINGLE_OUTAGES} (single), "
                    f"{CLUSTER_OUTAGES} (cluster)")  # fmt: skip
    ap.add_argument("--ops", type=int, default=600, help="operations at the planned pace")
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--kill-kinds", default="", help="e.g. worker,relay (default: all)")
    ap.add_argument("--gap", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--settle", type=float, default=300.0, help="seconds to wait for quiet")
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--replay", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-report", action="store_true", help="do not update RESULTS.md")
    ap.add_argument("--json", type=Path, default=None, help="write the result here as JSON")
    ap.add_argument(
        "--render", type=Path, default=None, help="rewrite the section from a saved result"
    )
    a = ap.parse_args(argv)
    if a.render is not None:
        saved = json.loads(a.render.read_text())
        args = saved.get("argv", ["--deployment", saved.get("deployment", "single")])
        return main([*args, "--replay", str(a.render), *(["--no-report"] * a.no_report)])
    spec = a.outages or (SINGLE_OUTAGES if a.deployment == "single" else CLUSTER_OUTAGES)
    outages = parse_outages(spec)
    if a.deployment == "single" and any(o.kind == "primary" for o in outages):
        ap.error("a primary outage needs --deployment cluster")
    if a.deployment == "cluster" and any(o.kind == "ledger" for o in outages):
        ap.error("on a cluster the ledger's outage is a primary's: primary:S")
    cfg = ChaosConfig(ops=a.ops, kills=a.kills, seed=a.seed, settle_timeout=a.settle)
    ocfg = OutageConfig(
        outages=outages,
        gap=a.gap,
        warmup=a.warmup,
        max_seconds=a.max_seconds,
        kill_kinds=tuple(k for k in a.kill_kinds.split(",") if k),
    )
    kind = OutageChaos if a.deployment == "single" else ClusterOutageChaos
    if a.replay is not None:
        names = {f.name for f in fields(ChaosResult)}
        saved = json.loads(a.replay.read_text())
        res = ChaosResult(**{k: v for k, v in saved.items() if k in names})
    else:

        def stop(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)  # unwinds through run()'s finally: all stopped

        signal.signal(signal.SIGTERM, stop)
        res = kind(cfg, ocfg).run()
    v = verdict(res)
    raw = {**res.as_dict(), "verdict": v, "ok": v["ok"], "deployment": a.deployment}
    raw["argv"] = _run_args(argv)
    print(outage_summary(res), flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps(raw, indent=1, default=str))
    if not a.no_report:
        from bench import report

        report.update(kind.SECTION, render(res, cfg, ocfg, a.deployment), raw)
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
