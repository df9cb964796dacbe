"""How long ``toolq status`` takes as the ledger grows (10^3 .. 10^6 operations).

    .venv/bin/python -m bench.status_bench [--sizes 1000,100000,1000000] [--runs 15]

Starts an embedded Valkey (or uses ``TOOLQ_BENCH_REDIS_URL``; the database is
flushed), fills it with operations written straight into the ledger's keys
(a record hash, the per-tool-per-state index entry, the due-set entry of
unfinished ones) by a Lua loop, and times :func:`toolq.edges.monitor.status_snapshot`
without the worker ping: the median of several runs per size. Then it times
one snapshot with the ping (bounded by its timeout, whatever the size) and one
Prometheus scrape at the largest size.

The snapshot reads a fixed number of keys per tool and state, so its time
should not grow with the number of operations; the issue asks for < 100 ms at
10^6.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import redis
from prometheus_client import CollectorRegistry, generate_latest

from toolq.adapters.embedded import EmbeddedServer
from toolq.client.queue import ToolQueue
from toolq.edges.metrics import LedgerCollector
from toolq.edges.monitor import STATES, status_snapshot

TOOLS = ("create_invoice", "send_email", "refund_payment", "lookup_customer", "update_crm")
# Per 100 operations: how many sit in each state (a ledger that has run a while).
MIX = {
    "succeeded": 70, "failed": 4, "escalated": 2, "cancelled": 2, "queued": 6, "running": 3,
    "waiting_retry": 5, "verifying": 3, "awaiting_approval": 3, "needs_input": 2,
}  # fmt: skip
assert sum(MIX.values()) == 100 and set(MIX) == set(STATES)
FINISHED = ("succeeded", "failed", "escalated", "cancelled")

# ARGV: prefix first count now_ms tools_csv states_csv(100 entries)
FILL = r"""
local P, first, count, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tools, slots = {}, {}
for t in string.gmatch(ARGV[5], '[^,]+') do table.insert(tools, t) end
for s in string.gmatch(ARGV[6], '[^,]+') do table.insert(slots, s) end
local finished = {succeeded = true, failed = true, escalated = true, cancelled = true}
for i = first, first + count - 1 do
  local ref = 'bench/' .. i
  local tool = tools[(i % #tools) + 1]
  local state = slots[(math.floor(i / #tools) % 100) + 1]
  local entered = now - (i % 86400000)
  redis.call('HSET', P .. ':op:' .. ref, 'ref', ref, 'tool', tool, 'state', state,
    'attempt', 1, 'max_attempts', 5, 'created', entered, 'entered', entered, 'rev', 1)
  redis.call('ZADD', P .. ':idx:' .. tool .. ':' .. state, entered, ref)
  if not finished[state] then redis.call('ZADD', P .. ':due', now + (i % 600000), ref) end
  redis.call('HINCRBY', P .. ':stats', tool .. '|submitted', 1)
end
redis.call('SADD', P .. ':tools', unpack(tools))
return count
"""


def fill(client: redis.Redis, prefix: str, first: int, count: int, now_ms: int) -> None:
    slots = ",".join(state for state, n in MIX.items() for _ in range(n))
    script = client.register_script(FILL)
    chunk = 20_000
    for start in range(first, first + count, chunk):
        n = min(chunk, first + count - start)
        script(args=[prefix, start, n, now_ms, ",".join(TOOLS), slots])


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def describe(label: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return (
        f"{label:<34} median {statistics.median(ms):7.2f} ms   p90 {p90:7.2f} ms   "
        f"min {ms[0]:7.2f} ms   max {ms[-1]:7.2f} ms   ({len(ms)} runs)"
    )


def bench(url: str, sizes: list[int], runs: int) -> None:
    client = redis.Redis.from_url(url)
    client.flushdb()
    tq = ToolQueue(redis_url=url)
    now_ms = int(time.time() * 1000)
    have = 0
    for size in sizes:
        started = time.perf_counter()
        fill(client, tq.ledger.keys.tag, have, size - have, now_ms)
        have = size
        took = time.perf_counter() - started
        mem = client.info("memory")["used_memory_human"]
        print(f"\n{size:>9,} operations (filled in {took:.1f} s, server memory {mem})")
        snap = status_snapshot(tq, workers=False)  # warm-up: connection, tool list
        assert sum(snap["totals"]["states"].values()) == size, snap["totals"]
        ms = timed(lambda: status_snapshot(tq, workers=False), runs)
        print("  " + describe("status_snapshot(workers=False)", ms))
    print(f"\nat {have:,} operations:")
    ms = timed(lambda: status_snapshot(tq, workers=True, worker_timeout=0.5), 3)
    print("  " + describe("status_snapshot(workers=True, 0.5s)", ms))
    print("    (no worker is running: the ping waits out its timeout, beside the reads)")
    registry = CollectorRegistry()
    registry.register(LedgerCollector(tq))
    ms = timed(lambda: generate_latest(registry), runs)
    print("  " + describe("prometheus scrape (ledger series)", ms))
    tq.close()
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    url = os.environ.get("TOOLQ_BENCH_REDIS_URL")
    if url:
        bench(url, sizes, args.runs)
        return
    with EmbeddedServer(appendonly=False) as server:
        bench(server.url, sizes, args.runs)


if __name__ == "__main__":
    main()
