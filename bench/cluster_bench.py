"""``python -m bench.cluster_bench``: how far cells on a Valkey Cluster scale (issue 18).

Per round, for N = 1, 2 and 3 primaries (no replicas: a replica only copies
its primary's writes, and failover is the chaos tests' subject, not this one's),
a fresh Valkey Cluster of embedded servers (``tests.cluster.Cluster``) holds the
ledger in cells mode (``TOOLQ_CELLS=256``, ``TOOLQ_CLUSTER=1``); Celery's broker
is a plain embedded Valkey outside the cluster (outbox mode). Fresh processes
per run: a prefork ``-c 2`` worker, a scheduler and one relay. Plus, in the same
rounds, the single-server baseline: one embedded Valkey in inline mode (no
cells, the ledger's server is the broker), the same worker and scheduler.

The client runs in a subprocess of its own (the mode is a setting of the
client too): 200 calls of warm-up, then ``--calls`` no-op calls in a closed loop
at 16 in flight. Around that loop it reads every primary's (and the broker's)
``INFO cpu`` (user + system) and ``INFO commandstats``: per call, each node's
server CPU and commands. Before the client starts, the idle processes' cost
(scheduler and relay rounds over 256 cells, heartbeats) is read over
``--idle`` seconds. Rounds alternate the order of the modes; medians.

On this 2-core box the worker and the client bound calls/s, not the servers;
the per-node cost is what the projection extrapolates from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import key_slot

from bench import procs
from bench.common import commandstats, diff_stats, fmt, median, server
from bench.load import closed_loop
from bench.report import table, update
from tests.cluster import HOST, Cluster
from toolq.adapters.ledger import spread
from toolq.core.keys import Keys

APP = "bench.apps:tq"
CELLS = 256
PREFIX = "toolq"
INLINE = "inline"
#: The modes of a round: the single-server baseline, then N primaries.
MODES = (INLINE, "1", "2", "3")
WARMUP = 200
IN_FLIGHT = 16
#: No replicas and no failover here: the default node timeout, so that a node
#: slowed by the shared CPU is never taken for dead.
NODE_TIMEOUT_MS = 15_000


def server_cpu(client: redis.Redis) -> float:
    """CPU seconds the server process has used (user + system)."""
    c = client.info("cpu")
    return float(c["used_cpu_sys"]) + float(c["used_cpu_user"])


def snapshot(urls: list[str]) -> list[tuple[float, dict[str, int]]]:
    """Every server's CPU seconds and commandstats, now."""
    out = []
    for url in urls:
        with redis.Redis.from_url(url, socket_timeout=60) as c:
            out.append((server_cpu(c), commandstats(c)))
    return out


def deltas(
    before: list[tuple[float, dict[str, int]]], after: list[tuple[float, dict[str, int]]]
) -> list[dict[str, Any]]:
    """Per server: CPU µs and commands between two snapshots (this bench's INFO left out)."""
    out = []
    for (cpu0, cmd0), (cpu1, cmd1) in zip(before, after, strict=True):
        cmds = diff_stats(cmd0, cmd1)
        cmds.pop("info", None)
        out.append(
            {
                "cpu_us": (cpu1 - cpu0) * 1e6,
                "commands": float(sum(cmds.values())),
                "by_command": cmds,
            }
        )
    return out


def client_main(nodes: list[str], broker: str, calls: int) -> None:
    """In the client subprocess (settings in its environment): one JSON line."""
    from bench import apps

    tq = apps.tq

    def call(i: int) -> None:
        env = tq.wait(tq.submit("noop", {"n": i}).operation_ref, timeout=60)
        if not env.ok:
            raise RuntimeError(env.code)

    closed_loop(call, WARMUP, IN_FLIGHT)
    urls = nodes + ([broker] if broker else [])
    before = snapshot(urls)
    res = closed_loop(call, calls, IN_FLIGHT)
    d = deltas(before, snapshot(urls))
    print(
        json.dumps(
            {
                "rate": res.rate,
                "seconds": res.seconds,
                "errors": res.errors,
                "nodes": d[: len(nodes)],
                "broker": d[len(nodes)] if broker else None,
            }
        )
    )
    tq.close()


@dataclass
class Deployment:
    """Where one run's ledger lives: the URL processes get, the primaries, the broker."""

    url: str
    nodes: list[str]
    broker: str
    env: dict[str, str] = field(default_factory=dict)
    #: Cells each primary serves (cluster modes).
    cells: list[int] = field(default_factory=list)


def cells_per_node(cluster: Cluster) -> list[int]:
    """How many of the deployment's cells each primary serves (in ``cluster.nodes`` order)."""
    ranges = cluster.nodes[0].call("CLUSTER", "SLOTS")
    ports = [n.port for n in cluster.nodes]
    counts = [0] * len(ports)
    for c in range(CELLS):
        slot = key_slot(Keys(PREFIX, c).due.encode())
        for first, last, primary, *_ in ranges:
            if first <= slot <= last:
                counts[ports.index(int(primary[1]))] += 1
    return counts


def balance_cells(url: str) -> None:
    """``toolq cells balance`` before the processes start: the cell count recorded as
    the first process would (HSETNX), then the cells' slots spread by cells per node."""
    with redis.RedisCluster.from_url(url) as cluster:
        cluster.hsetnx(Keys(PREFIX).meta, "cells", CELLS)
    client = redis.Redis.from_url(url)
    nodes = spread.Nodes(client)
    try:
        spread.balance(nodes, spread.plan_for(client, nodes, PREFIX), lambda *_: None)
    finally:
        nodes.close()
        client.close()


@contextlib.contextmanager
def deployment(mode: str, broker_url: str, balanced: bool = False) -> Iterator[Deployment]:
    """A fresh server (inline) or cluster of N primaries for one run; stopped after it.
    ``balanced``: the cells spread by cells per node (``toolq cells balance``) first."""
    common = {"TOOLQ_DURABILITY": "none"}  # appendonly is off everywhere: nothing to wait for
    if mode == INLINE:
        with server(None) as srv:
            yield Deployment(srv.url, [srv.url], "", {**common, "TOOLQ_REDIS_URL": srv.url})
        return
    with Cluster(primaries=int(mode), replicas=0, node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        url = f"redis://{HOST}:{cluster.nodes[0].port}"
        if balanced:
            balance_cells(url)
            cluster.wait_ok()
        env = {
            **common,
            "TOOLQ_REDIS_URL": url,
            "TOOLQ_CELLS": str(CELLS),
            "TOOLQ_CLUSTER": "1",
            "TOOLQ_BROKER_URL": broker_url,
        }
        nodes = [f"redis://{HOST}:{n.port}" for n in cluster.nodes]
        yield Deployment(url, nodes, broker_url, env, cells_per_node(cluster))


def one_run(mode: str, broker_url: str, a: argparse.Namespace) -> dict[str, Any]:
    with deployment(mode, broker_url, a.balance) as dep:
        kids = [
            procs.toolq_worker(
                f"cluster-{mode}-worker",
                APP,
                dep.url,
                pool="prefork",
                concurrency=2,
                queues="toolq.calls,toolq.verify",
                env=dep.env,
            ),
            procs.toolq_scheduler(f"cluster-{mode}-scheduler", APP, dep.url, env=dep.env),
        ]
        if dep.broker:
            kids.append(
                procs.python_child(
                    f"cluster-{mode}-relay",
                    [
                        "-m",
                        "toolq.edges.cli",
                        "relay",
                        "--app",
                        APP,
                        "--redis-url",
                        dep.url,
                        "-l",
                        "WARNING",
                    ],
                    dep.env,
                )
            )
        try:
            time.sleep(3.0)  # processes up (leases taken, groups created) before measuring
            urls = dep.nodes + ([dep.broker] if dep.broker else [])
            before = snapshot(urls)
            time.sleep(a.idle)
            idle = [x["cpu_us"] / a.idle for x in deltas(before, snapshot(urls))]
            out = subprocess.run(
                [
                    *(sys.executable, "-m", "bench.cluster_bench", "--client"),
                    *("--nodes", ",".join(dep.nodes), "--broker", dep.broker),
                    *("--calls", str(a.calls)),
                ],
                env=procs.child_env(dep.env),
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if out.returncode:
                dead = "; ".join(f"{k.name}: {k.tail(5)}" for k in kids if not k.alive())
                raise RuntimeError(f"client failed ({mode}): {out.stderr[-2000:]} {dead}")
            res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            for k in kids:
                k.stop()
    res["idle_us_per_s"] = idle[: len(dep.nodes)]
    res["broker_idle_us_per_s"] = idle[len(dep.nodes)] if dep.broker else None
    res["cells"] = dep.cells
    return summarize(res, a.calls)


def summarize(res: dict[str, Any], calls: int) -> dict[str, Any]:
    """Per-call figures of one run."""
    cpu = [n["cpu_us"] / calls for n in res["nodes"]]
    total = sum(cpu)
    res["node_us"] = cpu
    res["total_us"] = total
    res["node_cmds"] = [n["commands"] / calls for n in res["nodes"]]
    res["busiest_share"] = max(cpu) / total if total else float("nan")
    res["broker_us"] = res["broker"]["cpu_us"] / calls if res["broker"] else float("nan")
    return res


def med(runs: list[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in runs])


def med_each(runs: list[dict[str, Any]], key: str) -> list[float]:
    """The median of each node's figure over the runs."""
    return [median([r[key][i] for r in runs]) for i in range(len(runs[0][key]))]


def server_bench() -> str:
    """What ``python -m bench server`` last measured for toolq (prefork), as a clause."""
    path = Path(__file__).resolve().parent / "results" / "server.json"
    with contextlib.suppress(OSError, KeyError, ValueError):
        runs = json.loads(path.read_text())["pools"]["prefork -c 2"]["runs"]["toolq"]
        us = median([r["server_cpu_us"] for r in runs])
        return f" (`python -m bench server`, in its own run: {us:.0f} µs, ~{1e6 / us:,.0f} calls/s)"
    return ""


def skew(runs: list[dict[str, Any]], calls: int) -> str:
    """The commands the busiest node runs beyond the others' mean, per call (medians)."""
    node_us = med_each(runs, "node_us")
    top = node_us.index(max(node_us))
    names = {k for r in runs for n in r["nodes"] for k in n["by_command"]}
    per = {
        k: [
            median([r["nodes"][i]["by_command"].get(k, 0) / calls for r in runs])
            for i in range(len(node_us))
        ]
        for k in names
    }
    extra = []
    for k, xs in per.items():
        others = [x for i, x in enumerate(xs) if i != top]
        more = xs[top] - sum(others) / len(others)
        if more >= 0.5:
            extra.append((more, f"`{k}` +{more:.1f}"))
    text = ", ".join(t for _, t in sorted(extra, reverse=True)) or "none"
    if "command|getkeys" in text:
        text += (
            " (redis-py asks its default node for the keys of a command marked movable-keys: "
            "the relay's pipelined XREADGROUP per outbox; `LedgerCluster` reads only FCALL's "
            "keys itself)"
        )
    return text


def render(runs: dict[str, list[dict[str, Any]]], a: argparse.Namespace) -> str:
    rows = []
    proj = []
    base = med(runs[INLINE], "total_us")
    for mode in MODES:
        rs = runs[mode]
        node_us = med_each(rs, "node_us")
        mean_us = sum(node_us) / len(node_us)
        cmds = med_each(rs, "node_cmds")
        idle = sum(med_each(rs, "idle_us_per_s")) / 1000
        n = len(node_us)
        cells = " / ".join(str(c) for c in rs[0]["cells"]) if rs[0]["cells"] else "-"
        rows.append(
            (
                "1 server, inline (no cells)"
                if mode == INLINE
                else f"{n} primar{'y' if n == 1 else 'ies'}",
                fmt(med(rs, "rate")),
                " / ".join(f"{x:.0f}" for x in node_us),
                fmt(mean_us, 0),
                f"**{med(rs, 'total_us'):.0f}**",
                " / ".join(f"{x:.1f}" for x in cmds),
                f"{med(rs, 'busiest_share'):.2f} (1/N {1 / n:.2f})",
                cells,
                fmt(idle),
                fmt(med(rs, "broker_us"), 0),
                sum(r["errors"] for r in rs),
            )
        )
        if mode != INLINE:
            # The busiest primary saturates first: the deployment's ceiling is its.
            busiest = max(node_us)
            proj.append(
                f"1 primary holding all {CELLS} cells: {mean_us:.0f} µs/call → "
                f"~{1e6 / mean_us:,.0f} calls/s"
                if n == 1
                else f"{n} primaries: {mean_us:.0f} µs/call per node on average → one primary "
                f"~{1e6 / mean_us:,.0f} calls/s, x {n} = ~{n * 1e6 / mean_us:,.0f} calls/s "
                f"if the work spread evenly; the busiest node ({busiest:.0f} µs/call) bounds "
                f"it as measured: ~{1e6 / busiest:,.0f} calls/s"
            )
    one = med_each(runs["1"], "node_us")[0]
    totals = {m: med(runs[m], "total_us") for m in MODES[1:]}
    three = med_each(runs["3"], "node_us")
    broker = med(runs["3"], "broker_us")
    node_us3 = med_each(runs["3"], "node_us")
    busiest3 = node_us3.index(max(node_us3))
    summed_cmds = " / ".join(f"{sum(med_each(runs[m], 'node_cmds')):.1f}" for m in MODES[1:])
    return (
        "## Cells on a Valkey Cluster: how far it scales (issue 18)\n\n"
        f"`python -m bench.cluster_bench --calls {a.calls} --rounds {a.rounds}"
        f"{' --balance' if a.balance else ''}`: per run, a "
        f"fresh Valkey Cluster of N embedded primaries (no replicas: they only copy writes; "
        f"failover is the chaos tests' subject), the ledger in {CELLS} cells "
        "(`TOOLQ_CELLS`, `TOOLQ_CLUSTER=1`), Celery's broker a plain embedded Valkey outside "
        "the cluster (outbox mode), fresh processes (prefork -c 2 worker, scheduler, one "
        "relay); the baseline: one embedded Valkey in inline mode (no cells, the ledger's "
        "server is the broker), the same worker and scheduler. `TOOLQ_DURABILITY=none` "
        f"everywhere (appendonly off). {WARMUP} calls of warm-up, then {a.calls:,} no-op "
        f"calls closed loop at {IN_FLIGHT} in flight; every server's `INFO cpu` (user + "
        "system) and `INFO commandstats` read around that loop, per call (idle costs "
        f"included; measured alone over {a.idle:g} s before the run, they are the idle "
        f"column, summed over the ledger's nodes). {a.rounds} rounds, mode order alternating, "
        "medians. Busiest share: the busiest primary's part of the ledger nodes' server CPU "
        "(even spread = 1/N).\n\n"
        + table(
            (
                "ledger",
                "calls/s",
                "server µs/call, each node",
                "mean per node",
                "total over nodes",
                "commands/call, each node",
                "busiest share",
                "cells per node",
                "idle ms/s",
                "broker µs/call",
                "errors",
            ),
            rows,
        )
        + "\n\n**Projection** (an extrapolation, not a measurement: on this 2-core box the "
        "worker and the client bound calls/s, every server shares the two cores with them, "
        "and a busy server spends less per call on its idle rounds than these runs "
        "did):\n\n"
        + "\n".join(f"- {p}." for p in proj)
        + f"\n- For comparison, one server in inline mode: {base:.0f} µs/call → "
        f"~{1e6 / base:,.0f} calls/s{server_bench()}. One primary in cells mode: "
        f"{one:.0f} µs/call ({one / base:.2f} of inline: the {CELLS}-cell "
        "scheduler and relay rounds, the outbox in place of the list push, any "
        "`command|getkeys` (below)); three "
        f"primaries: {' / '.join(f'{x:.0f}' for x in three)} µs/call per node.\n"
        f"- The outbox broker is one plain Valkey here ({broker:.0f} µs/call with three "
        f"primaries, ~{1e6 / broker:,.0f} calls/s): past that, the broker is the next "
        "ceiling (RabbitMQ quorum queues, or more than one broker), not the ledger.\n"
        "- Scaling is not linear yet: the server CPU of a call summed over the nodes grows "
        f"with N ({' → '.join(f'{totals[m]:.0f}' for m in MODES[1:])} µs for 1 → 2 → 3 "
        f"primaries), so the mean per node falls {one / (totals['3'] / 3):.1f}x from 1 to "
        "3 primaries, not 3x. Not more work: the commands per call summed over the nodes "
        f"are {summed_cmds} "
        "for 1 / 2 / 3 primaries (notices are SPUBLISHed to their cell's channel and stay on "
        "their node). Each command costs more CPU with more server processes sharing this "
        "box's 2 cores with the workers and the client, and the scheduler's and relay's "
        "rounds over every cell on every node (the idle column) are spread over the calls "
        "of a run this box keeps slow.\n"
        f"- With three primaries the busiest is node {busiest3}"
        + (
            " (the processes' startup node, so redis-py's default node; it also holds the "
            "deployment-wide `{toolq}` keys, slot 3607)"
            if busiest3 == 0
            else " (not node 0, the processes' startup node and redis-py's default node, "
            "which holds the deployment-wide `{toolq}` keys, slot 3607)"
        )
        + "; the commands it runs per call beyond the others' mean: "
        f"{skew(runs['3'], a.calls)}. Its cells alone would give it "
        f"{max(runs['3'][0]['cells']) / CELLS:.2f} of the work"
        + (
            ": the cells were spread by cells per node before each run (`--balance`, "
            "`toolq cells balance`).\n"
            if a.balance
            else f": the {CELLS} cell tags fall unevenly into equal slot ranges "
            "(`--balance` spreads them by cells per node first, `toolq cells balance`).\n"
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog="Writes the 'cluster' section of bench/RESULTS.md and bench/results/cluster.json "
        "(BENCH_OUT elsewhere for a trial run). About 30 s per run on 2 cores at the defaults.",
    )
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--nodes", help=argparse.SUPPRESS)
    ap.add_argument("--broker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=2000, help="closed-loop calls per run (2000)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="rounds of all four modes, order alternating (2)"
    )
    ap.add_argument(
        "--idle", type=float, default=2.0, help="seconds the idle cost is read per run (2)"
    )
    ap.add_argument(
        "--balance",
        action="store_true",
        help="spread the cells by cells per primary (`toolq cells balance`) before each run",
    )
    a = ap.parse_args()
    if a.client:
        client_main(a.nodes.split(","), a.broker, a.calls)
        return
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with server(None) as broker:
        for r in range(a.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                broker.flush()
                res = one_run(mode, broker.url, a)
                runs[mode].append(res)
                print(
                    f"  round {r + 1}/{a.rounds} {mode:6} {res['rate']:6.1f} calls/s, server "
                    f"µs/call {' / '.join(f'{x:.0f}' for x in res['node_us'])} "
                    f"(total {res['total_us']:.0f}, broker {res['broker_us']:.0f}), "
                    f"busiest share {res['busiest_share']:.2f}, errors {res['errors']}",
                    flush=True,
                )
    md = render(runs, a)
    update("cluster", md, {"calls": a.calls, "rounds": a.rounds, "cells": CELLS, "runs": runs})
    print(md)


if __name__ == "__main__":
    main()
