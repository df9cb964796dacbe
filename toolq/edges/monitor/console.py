"""The console's reads: the overview (the status snapshot read on ``tq.aio``, plus the
pending-recovery summary, the scheduler's lag and the recent rates) and the chart's
series (:mod:`toolq.services.scheduler.series`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from toolq.adapters.ledger import dep_state as deps
from toolq.core.layout import SingleTag
from toolq.core.text import as_text
from toolq.edges.monitor.read import (
    Sources,
    attention_of,
    broker_depths,
    known_tools,
    parse_common,
    parse_escalated,
    parse_tool,
    queue_common,
    queue_escalated,
    queue_tool,
    settings_sources,
    shape_read,
)
from toolq.edges.monitor.shape import shape_overview, shape_workers, waiting
from toolq.services.scheduler import series as samples
from toolq.services.scheduler.series import Point
from toolq.services.scheduler.trust import WINDOWS, trust_figures

if TYPE_CHECKING:
    from toolq.client.aio import AsyncToolQueue


#: The chart shows at most this many hours (what the series keeps).
MAX_SERIES_HOURS = samples.KEEP_S / 3600


async def aread_status(
    client: aioredis.Redis, sources: Sources, *, now_ms: int, tools_hint: Iterable[str] = ()
) -> dict[str, Any]:
    """:func:`read_status` on ``redis.asyncio``, with the overview's extra reads in the
    same pipeline: each tool's oldest escalated operation and the last hour's samples."""
    guess = sorted(set(tools_hint))
    fields = samples.series_fields(now_ms, 1.0)
    async with client.pipeline(transaction=False) as pipe:
        queue_common(pipe, sources, now_ms)
        pipe.hmget(sources.keys.series, [str(f) for f in fields])
        for tool in guess:
            queue_tool(pipe, sources, tool)
            queue_escalated(pipe, sources, tool)
        layout = sources.layout or SingleTag(sources.keys.prefix)
        deps.queue_list(pipe, layout)
        replies = iter(await pipe.execute())
    common = parse_common(replies, sources, now_ms)
    sampled = [samples.parse_sample(raw) for raw in next(replies)]
    per_tool, escalated = {}, {}
    for tool in guess:
        per_tool[tool] = parse_tool(replies, sources)
        escalated[tool] = parse_escalated(replies, sources)
    dep_names = deps.parse_list([next(replies) for _ in layout.every_cell()])
    ledger_tools = known_tools(common)
    missing = sorted(ledger_tools - set(guess))
    if missing:
        async with client.pipeline(transaction=False) as pipe:
            for tool in missing:
                queue_tool(pipe, sources, tool)
                queue_escalated(pipe, sources, tool)
            more = iter(await pipe.execute())
        for tool in missing:
            per_tool[tool] = parse_tool(more, sources)
            escalated[tool] = parse_escalated(more, sources)
    snap = shape_read(common, per_tool, ledger_tools, sources, now_ms)
    snap["workers"] = shape_workers(common["nodes"], now_ms, sources.alive_ms)
    snap["waiting"] = waiting(snap, now_ms)
    views = await deps.AsyncDepState(client, layout).views(now_ms, dep_names) if dep_names else []
    snap["deps"] = [attention_of(v) for v in views if deps.needs_attention(v)]
    oldest_escalated = {
        t: (as_text(first[0][0]), int(first[0][1])) for t, first in escalated.items() if first
    }
    return shape_overview(snap, oldest_escalated, samples.points(sampled), now_ms)


async def overview(aio: AsyncToolQueue) -> dict[str, Any]:
    """What the console's overview shows, as a JSON-able dict: the status snapshot
    (:func:`status_snapshot`'s keys, workers from their heartbeats) plus ``pending``,
    ``scheduler.lag_s`` and ``rates`` (:func:`shape_overview`). Two round trips at
    most, none a broadcast."""
    app = aio.app
    hint = frozenset(t.name for t in app.registry) | app.seen_tools
    client = await aio.client()
    sources = settings_sources(aio.app.settings)
    snap = await aread_status(client, sources, now_ms=app.now_ms(), tools_hint=hint)
    app.seen_tools = frozenset(snap["tools"])
    depths = broker_depths(aio.app.settings)
    if depths is not None:  # outbox mode: the queues are the broker's (kombu is sync)
        read = await asyncio.to_thread(depths, sources.queues)
        snap["queues"]["depth"] = {q: n for q, n in read.items() if n is not None}
    return snap


async def series(aio: AsyncToolQueue, hours: float) -> list[Point]:
    """The chart's points for the last ``hours`` (at most a day), oldest first; one
    ``HMGET``. Empty while no scheduler has sampled."""
    if not (isinstance(hours, int | float) and math.isfinite(hours)) or not (
        0 < hours <= MAX_SERIES_HOURS
    ):
        # here: ``toolq status`` imports this module, and the contract's models cost 30 ms
        from toolq.core import errors
        from toolq.core.envelope import FieldError

        raise errors.InvalidArguments(
            "hours out of range",
            field_errors=[
                FieldError(field="hours", rule=f"more than 0, at most {MAX_SERIES_HOURS:g}")
            ],
        )
    now = aio.app.now_ms()
    fields = samples.series_fields(now, float(hours))
    client = await aio.client()
    raw = await client.hmget(
        settings_sources(aio.app.settings).keys.series, [str(f) for f in fields]
    )
    found = samples.points([samples.parse_sample(r) for r in raw])
    return [p for p in found if p.at_ms > fields[0]]


async def trust(aio: AsyncToolQueue, window: str) -> dict[str, Any]:
    """The trust figures per tool over ``window`` (a key of
    :data:`toolq.services.scheduler.trust.WINDOWS`): from the series' samples at the
    window's start and in it, to the ledger's counters read now. One round trip (two on
    a system younger than the window: :func:`~toolq.services.scheduler.series.baseline_field`)."""
    if window not in WINDOWS:
        from toolq.core import errors
        from toolq.core.envelope import FieldError

        raise errors.InvalidArguments(
            "unknown window",
            field_errors=[FieldError(field="window", rule=f"one of {', '.join(WINDOWS)}")],
        )
    window_s = WINDOWS[window]
    now = aio.app.now_ms()
    sources = settings_sources(aio.app.settings)
    minutes, hours = samples.window_fields(now, window_s)
    tier, fields = (
        (sources.keys.series_tools, minutes) if minutes else (sources.keys.series_hourly, hours)
    )
    client = await aio.client()
    async with client.pipeline(transaction=False) as pipe:
        pipe.hmget(tier, [str(f) for f in fields])
        pipe.hkeys(tier)
        for k in sources.cell_keys:
            pipe.hgetall(k.stats)
        replies = await pipe.execute()
    raw = list(replies[0])
    # The baseline, when the sparse fields missed it (a young system): one more read.
    extra = samples.baseline_field(replies[1], fields, now, window_s)
    if extra is not None:
        raw.append(await client.hget(tier, str(extra)))
    found = [s for s in (samples.parse_tools_sample(r) for r in raw) if s is not None]
    stats: dict[str, int] = {}
    for cell in replies[2:]:  # summed over the cells
        for k, v in cell.items():
            stats[as_text(k)] = stats.get(as_text(k), 0) + int(v)
    found.append(samples.sample_of(stats, {}, now))
    return {"window": window, **trust_figures(found, now_ms=now, window_s=window_s)}
