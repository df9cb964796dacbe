"""Chaos on a Valkey Cluster (issue 18): bench.chaos's run with the ledger in cells.

    python -m bench.cluster_chaos --ops 2000 --kills 30

The harness of :mod:`bench.chaos` (the same workers, schedulers, provider faults,
duplicate deliveries and verdict) on a different deployment: the ledger in 256
cells (``TOOLQ_CELLS=256``, ``TOOLQ_CLUSTER=1``) on a Valkey Cluster of three
primaries with a replica each (``tests.cluster.Cluster``: embedded servers, AOF
off; ``--durability``, ``fsync`` by default: each claim and submit then waits for
a replica, ``WAIT 1``), Celery's broker a separate embedded Valkey
(outbox mode), and two relays sharing the outboxes (one consumer group; a killed
relay's entries are taken over after ``relay.claim_after``, 5 s here). Besides
the kills of bench.chaos (relays are in the rotation too) it

* SIGKILLs a primary a third of the way through (not the processes' startup
  node; its replica takes over) and starts it again half way (it rejoins as a
  replica);
* moves one cell's slot to another primary two thirds of the way through
  (atomic slot migration, ``CLUSTER MIGRATESLOTS``);
* pushes copies of queued messages into the broker's queues, as bench.chaos does
  into the single server's.

The verdict is bench.chaos's (duplicate side effects, lost, stuck, ledger and
provider disagreeing), plus the outbox entries left once the system is quiet.
It writes the ``chaos-cluster`` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import redis
from redis.cluster import key_slot

from bench import chaos
from bench.chaos import ChaosConfig, ChaosResult, Role, summary, verdict_rows
from tests.cluster import HOST, Cluster
from toolq.adapters.embedded import EmbeddedServer
from toolq.core.cells import cell_of
from toolq.core.keys import Keys

CELLS = 256
PREFIX = "toolq"

ENV = {
    **chaos.ENV,
    "TOOLQ_CELLS": str(CELLS),
    "TOOLQ_CLUSTER": "1",
    # A killed relay's entries wait this long for another (30 s by default).
    "TOOLQ_RELAY__CLAIM_AFTER": "5",
}


class ClusterChaos(chaos.Chaos):
    """bench.chaos's run on a Cluster (see the module docstring)."""

    KILLS = {"worker": 0.2, "parent": 0.15, "pool_child": 0.25, "scheduler": 0.2, "relay": 0.2}
    DIR_PREFIX = "cluster-chaos"

    def __init__(self, cfg: ChaosConfig) -> None:
        super().__init__(cfg)
        self.roles += [Role("relay-1", "relay"), Role("relay-2", "relay")]
        self.cluster: Cluster | None = None
        self.broker: EmbeddedServer | None = None
        #: The primary SIGKILLed (revived later), and what the events measured.
        self.victim: Any = None
        self.events_done: dict[str, Any] = {}

    # ------------------------------------------------------------------ the deployment

    def start_servers(self) -> None:
        self.cluster = Cluster(primaries=3, replicas=1).start()
        self.broker = EmbeddedServer().start()
        # Processes start from this node; it is never the one killed.
        self.url = f"redis://{HOST}:{self.cluster.nodes[0].port}"
        self.log(f"cluster of 6 nodes up in {self.cluster.start_seconds:.1f} s")

    def stop_servers(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def client_env(self) -> dict[str, str]:
        assert self.broker is not None
        return {**ENV, "TOOLQ_BROKER_URL": str(self.broker.url)}

    def client(self) -> Any:
        assert self.cluster is not None
        return self.cluster.client(decode_responses=False, socket_timeout=10)

    def queues_client(self) -> redis.Redis:
        assert self.broker is not None
        return redis.Redis.from_url(str(self.broker.url), socket_timeout=10)

    def op_key(self, ref: str) -> str:
        return Keys(PREFIX, cell_of(ref, CELLS)).op(ref)

    def read_stats(self, r: Any) -> dict[str, int]:
        pipe = r.pipeline(transaction=False)
        for cell in range(CELLS):
            pipe.hgetall(Keys(PREFIX, cell).stats)
        total: dict[str, int] = {}
        for raw in pipe.execute():
            for k, v in raw.items():
                total[k.decode()] = total.get(k.decode(), 0) + int(v)
        return total

    # ------------------------------------------------------------------ the events

    def planned(self, start: float, seconds: float) -> list[tuple[float, str]]:
        return [
            (start + seconds * 0.3, "kill-primary"),
            (start + seconds * 0.5, "revive"),
            (start + seconds * 0.7, "migrate"),
        ]

    def event(self, name: str) -> None:
        cluster = self.cluster
        assert cluster is not None
        if name == "kill-primary":
            startup = cluster.nodes[0]
            slot = next(
                key_slot(Keys(PREFIX, c).due.encode())
                for c in self.rng.sample(range(CELLS), CELLS)
                if cluster.owner(key_slot(Keys(PREFIX, c).due.encode())) is not startup
            )
            self.victim, took = cluster.kill_primary(slot)
            self.events_done["failover_s"] = round(took, 2)
            self.events_done["killed_primary"] = self.victim.port
            self.log(f"SIGKILL primary {self.victim.port}; its replica took over in {took:.2f} s")
        elif name == "revive":
            cluster.revive(self.victim)
            self.events_done["revived"] = True
            self.log(f"primary {self.victim.port} back, as a replica")
        else:
            cell = self.rng.randrange(CELLS)
            slot = key_slot(Keys(PREFIX, cell).due.encode())
            source = cluster.owner(slot)
            target = self.rng.choice([p for p in cluster.primaries() if p is not source])
            took = cluster.migrate_slot(slot, target)
            self.events_done["migrated_cell"] = cell
            self.events_done["migrate_s"] = round(took, 2)
            moved = f"{source.port} -> {target.port}"
            self.log(f"cell {cell} (slot {slot}) moved {moved} in {took:.2f} s")

    # ------------------------------------------------------------------ the verdict

    def verdict(self, chaos_s: float, settled_s: float) -> ChaosResult:
        res = super().verdict(chaos_s, settled_s)
        r = self.client()
        try:
            pipe = r.pipeline(transaction=False)
            for cell in range(CELLS):
                pipe.xlen(Keys(PREFIX, cell).outbox)
            left = sum(pipe.execute())
        finally:
            r.close()
        res.cluster = {**self.events_done, "outbox_left": left}
        res.server_restarts = 0
        return res


def render(res: ChaosResult, cfg: ChaosConfig) -> str:
    from bench.report import table

    c = res.cluster
    server_rows = [
        (
            "primary SIGKILLed (replica took over), revived later",
            f"1: failover {c.get('failover_s', float('nan')):.2f} s"
            + ("; revived as a replica" if c.get("revived") else "; **not revived**"),
        ),
        (
            "cell moved to another primary (atomic slot migration)",
            f"cell {c.get('migrated_cell', '-')} in {c.get('migrate_s', float('nan')):.2f} s",
        ),
        ("outbox entries left once quiet", str(c.get("outbox_left", "?"))),
        ("republishes (scheduler, lost messages)", str(res.ledger_stats.get("republished", 0))),
    ]
    return (
        "## Chaos on a Valkey Cluster (issue 18)\n\n"
        f"`python -m bench.cluster_chaos --ops {cfg.ops} --kills {cfg.kills} --durability "
        f"{cfg.durability}`: the ledger in "
        f"{CELLS} cells (`TOOLQ_CELLS`, `TOOLQ_CLUSTER=1`) on a Valkey Cluster of 3 primaries "
        "with a replica each (embedded servers, AOF off, "
        + (
            "`TOOLQ_DURABILITY=fsync`: each claim and submit waits for a replica, `WAIT 1`)"
            if cfg.durability == "fsync"
            else "`TOOLQ_DURABILITY=none`)"
        )
        + ", Celery's "
        "broker a separate embedded Valkey (outbox mode), two relays sharing the outboxes "
        "(claim_after 5 s); calls workers prefork -c 3 and threads -c 4, a verify worker "
        "prefork -c 2, two schedulers; relays in the kill rotation; one primary SIGKILLed at "
        "30 % (revived at 50 %), one cell's slot migrated at 70 %. Provider, faults, duplicate "
        "deliveries and verdict as in Chaos above (dedup "
        f"**{'on' if res.dedup else 'off'}**). Lease 2 s, unclaimed_after 5 s, visibility "
        "timeout 20 s.\n\n" + table(("", ""), verdict_rows(res, server_rows))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.cluster_chaos", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dedup", action="store_true", help="provider deduplicates by key")
    ap.add_argument(
        "--durability",
        default="fsync",
        choices=("fsync", "none"),
        help="TOOLQ_DURABILITY (fsync, the default: with AOF off on the nodes, each claim "
        "and submit waits for a replica, WAIT 1)",
    )
    ap.add_argument("--no-report", action="store_true", help="do not update RESULTS.md")
    ap.add_argument("--json", type=Path, default=None, help="write the result here as JSON")
    a = ap.parse_args(argv)
    cfg = ChaosConfig(
        ops=a.ops,
        kills=a.kills,
        interval=a.interval,
        seed=a.seed,
        dedup=a.dedup,
        durability=a.durability,
    )
    res = ClusterChaos(cfg).run()
    print(summary(res))
    print(f"cluster: {res.cluster}")
    if a.json is not None:
        a.json.write_text(json.dumps(res.as_dict(), indent=1, default=str))
    if not a.no_report:
        from bench import report

        report.update("chaos-cluster", render(res, cfg), res.as_dict())
    return 0 if res.ok and not res.cluster.get("outbox_left") else 1


if __name__ == "__main__":
    sys.exit(main())
