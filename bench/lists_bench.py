"""How long a page of the console's lists takes at 10^6 operations.

    .venv/bin/python -m bench.lists_bench [--size 1000000] [--runs 15]

Starts an embedded Valkey (or uses ``TOOLQ_BENCH_REDIS_URL``; the database is
flushed) and fills the ledger's keys with pipelines, as the scripts leave them
(a record hash with its envelope, the per-tool-per-state index entry scored by
its entry time, the due-set entry of unfinished ones): nothing is run. Then it
times ``tq.aio.list_operations`` -- what ``GET /v1/operations`` and the
console's list pages await -- for each state and filter: the median of
``--runs`` calls, wall time in the calling process (Python and Redis both).
The issue asks for <= 200 ms per page at 10^6 operations.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import redis

from toolq.adapters.embedded import EmbeddedServer
from toolq.adapters.ledger import lists
from toolq.client.queue import ToolQueue
from toolq.core import errors
from toolq.core.envelope import ToolError
from toolq.core.record import OperationPage

TOOLS = ("create_invoice", "send_email", "refund_payment", "lookup_customer", "update_crm")
# Per 100 operations: how many sit in each state (a ledger that has run a while).
MIX = {
    "succeeded": 70, "failed": 4, "escalated": 2, "cancelled": 2, "queued": 6, "running": 3,
    "waiting_retry": 5, "verifying": 3, "awaiting_approval": 3, "needs_input": 2,
}  # fmt: skip
FINISHED = ("succeeded", "failed", "escalated", "cancelled")
#: About one in this many unfinished operations is UNAVAILABLE (the rare code a filter
#: looks for); the rest RATE_LIMITED (waiting_retry) or their state's usual code.
RARE = 997
REF = "@@REF@@"


def _envelope(failure: errors.ToolFailure, writes: bool = True) -> str:
    env: ToolError = errors.error_envelope(
        failure,
        writes=writes,
        operation_ref=REF,
        operation="create_invoice",
        call_id=None,
        attempts_remaining=3,
        now=datetime.now(UTC),
    )
    return env.model_dump_json(exclude_none=True)


def envelopes() -> dict[str, str]:
    return {
        "RATE_LIMITED": _envelope(errors.RateLimited(retry_after=30)),
        "UNAVAILABLE": _envelope(errors.Unavailable(retry_after=30)),
        "CONFLICT": _envelope(errors.Conflict(current_state_ref="x")),
        "APPROVAL": _envelope(errors.NeedsApproval()),
        "INPUT": _envelope(errors.InvalidInput(field="amount", rule="positive")),
        "UNKNOWN": _envelope(errors.OutcomeUnknown()),
    }


def code_for(state: str, i: int) -> str | None:
    if i % RARE == 0 and state not in ("succeeded", "queued", "running"):
        return "UNAVAILABLE"
    return {
        "waiting_retry": "RATE_LIMITED",
        "failed": "CONFLICT",
        "escalated": "RATE_LIMITED",
        "awaiting_approval": "APPROVAL",
        "needs_input": "INPUT",
        "verifying": "UNKNOWN",
    }.get(state)


def fill(client: redis.Redis, tq: ToolQueue, size: int, now_ms: int) -> None:
    keys = tq.ledger.keys
    slots = [state for state, n in MIX.items() for _ in range(n)]
    bodies = envelopes()
    pipe = client.pipeline(transaction=False)
    for i in range(size):
        ref = f"bench/{i:07d}"
        tool = TOOLS[i % len(TOOLS)]
        state = slots[(i // len(TOOLS)) % 100]
        entered = now_ms - (size - i) * 50  # one entry every 50 ms: ~14 h of history
        fields: dict[Any, Any] = {"ref": ref, "tool": tool, "state": state, "attempt": 1,
                                  "max_attempts": 5, "created": entered, "entered": entered,
                                  "rev": 1}  # fmt: skip
        code = code_for(state, i)
        if code is not None:
            fields["envelope"] = bodies[code].replace(REF, ref)
        pipe.hset(keys.op(ref), mapping=fields)
        pipe.zadd(keys.index(tool, state), {ref: entered})
        if state not in FINISHED:
            pipe.zadd(keys.due, {ref: now_ms + i % 600_000})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.sadd(keys.tools, *TOOLS)
    pipe.execute()


def timed(fn: Callable[[], Awaitable[OperationPage]], runs: int) -> tuple[list[float], Any]:
    async def go() -> tuple[list[float], Any]:
        out, page = [], None
        for _ in range(runs):
            started = time.perf_counter()
            page = await fn()
            out.append((time.perf_counter() - started) * 1000)
        return out, page

    return asyncio.run(go())


def bench(url: str, size: int, runs: int) -> list[tuple[str, float, float, str]]:
    client = redis.Redis.from_url(url)
    client.flushdb()
    tq = ToolQueue(redis_url=url)
    now_ms = int(time.time() * 1000)
    started = time.perf_counter()
    fill(client, tq, size, now_ms)
    mem = client.info("memory")["used_memory_human"]
    print(f"{size:,} operations filled in {time.perf_counter() - started:.0f} s ({mem})")

    mid = tq.list_operations("succeeded", tool="create_invoice", limit=1)
    deep = None
    if mid.items:  # a cursor half way down the largest list
        half = mid.items[0].entered_ms + (now_ms - mid.items[0].entered_ms) // 2
        deep = lists.encode_cursor(lists.Position(half, "bench/"))
    cases: list[tuple[str, dict[str, Any]]] = [
        ("waiting_retry, first page", {"state": "waiting_retry"}),
        ("waiting_retry, newest first", {"state": "waiting_retry", "newest_first": True}),
        ("succeeded (70%), first page", {"state": "succeeded"}),
        ("succeeded, half way down (cursor)", {"state": "succeeded", "cursor": deep}),
        ("succeeded, one tool", {"state": "succeeded", "tool": "send_email"}),
        ("succeeded, older than 1 h", {"state": "succeeded", "older_than_s": 3600}),
        ("escalated, limit 500", {"state": "escalated", "limit": 500}),
        ("waiting_retry, code (common)", {"state": "waiting_retry", "code": "RATE_LIMITED"}),
        ("waiting_retry, code (1 in 1000)", {"state": "waiting_retry", "code": "UNAVAILABLE"}),
        ("waiting_retry, code (absent)", {"state": "waiting_retry", "code": "NO_SUCH_CODE"}),
        ("waiting_retry, ref contains (rare)", {"state": "waiting_retry", "ref_contains": "99"}),
        ("succeeded, ref contains (none)", {"state": "succeeded", "ref_contains": "nope"}),
        ("every state, first page", {"state": None}),
        ("every state, newest first", {"state": None, "newest_first": True}),
        ("every state, search a ref (1 in 10^4)", {"state": None, "search": "bench/00099"}),
        ("every state, search a tool's name", {"state": None, "search": "send_em"}),
        ("every state, search (none)", {"state": None, "search": "nope"}),
    ]
    rows = []
    for label, kw in cases:
        state = kw.pop("state")
        ms, page = timed(functools.partial(tq.aio.list_operations, state, **kw), runs)
        note = f"{len(page.items)} rows, total {page.total}, scanned {page.scanned}"
        note += ", partial" if page.partial else ""
        rows.append((label, statistics.median(ms), max(ms), note))
        print(f"  {label:<36} median {rows[-1][1]:7.2f} ms  max {rows[-1][2]:7.2f} ms  {note}")
    tq.close()
    client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    url = os.environ.get("TOOLQ_BENCH_REDIS_URL")
    if url:
        bench(url, args.size, args.runs)
        return
    with EmbeddedServer(appendonly=False) as server:
        bench(server.url, args.size, args.runs)


if __name__ == "__main__":
    main()
