"""Cells mode on one server (issue 18): the ledger split into cells, each call by ref
in its ref's cell, real workers and a scheduler (retries, verification) across them."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import pytest
import redis

from tests.helpers import start_scheduler, start_toolq, start_worker, stop_process, stop_processes
from tests.integration.apps import cells_app
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.keys import Keys
from toolq.core.settings import ToolqSettings
from toolq.edges.monitor import status_snapshot
from toolq.services.scheduler.series import Sampler

CELLS = 8
APP = cells_app.APP


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    settings = cells_app.SETTINGS.model_copy(update={"cells": CELLS, "durability": "none"})
    client = cells_app.make(settings)
    client.configure(redis_url=module_redis_url)
    env = {"TOOLQ_CELLS": str(CELLS), "TOOLQ_DURABILITY": "none"}
    procs = [
        start_worker(APP, module_redis_url, env=env),
        start_scheduler(APP, module_redis_url, env=env),
    ]
    yield client
    stop_processes(procs, timeout=5)
    client.close()


def _effects(r: redis.Redis, ref: str) -> int:
    return sum(1 for x in r.lrange("provider:effects", 0, -1) if x.decode() == ref)


def test_calls_in_every_cell_complete_once_each_in_their_cell(tq: ToolQueue) -> None:
    refs = [f"cells/ok/{i}" for i in range(24)]
    assert {cell_of(ref, CELLS) for ref in refs} == set(range(CELLS))
    for ref in refs:
        tq.submit("pay", {}, operation_ref=ref)
    for ref in refs:
        assert tq.wait(ref, timeout=30).ok
    r = tq.redis
    for ref in refs:
        assert _effects(r, ref) == 1
        # the record is in its cell's keys, and nowhere under the single tag
        assert r.exists(Keys("toolq", cell_of(ref, CELLS)).op(ref))
        assert not r.exists(Keys("toolq").op(ref))
        record = tq.get(ref)
        assert record is not None and record.state == "succeeded"
    assert not r.keys("{toolq}:op:*")
    assert sum(v for k, v in tq.ledger.stats().items() if k.endswith("|succeeded")) >= len(refs)
    assert tq.ledger.tools() == ["pay"]


def test_the_scheduler_retries_and_verifies_across_cells(tq: ToolQueue) -> None:
    limited = [f"cells/rl/{i}" for i in range(4)]
    lost = [f"cells/lost/{i}" for i in range(4)]
    for ref in limited:
        tq.submit("pay", {"mode": "rate_limited"}, operation_ref=ref)
    for ref in lost:
        tq.submit("pay", {"mode": "lost_reply"}, operation_ref=ref)
    for ref in limited:
        assert tq.wait(ref, timeout=30).ok
        record = tq.get(ref)
        assert record is not None and record.attempt == 3
    for ref in lost:
        result = tq.wait(ref, timeout=30)
        assert result.ok  # the verifier found the write: no second attempt
        record = tq.get(ref)
        assert record is not None and record.attempt == 1
    for ref in limited + lost:
        assert _effects(tq.redis, ref) == 1


def test_another_number_of_cells_is_refused_for_the_ledgers_life(
    tq: ToolQueue, module_redis_url: str
) -> None:
    other = cells_app.make(cells_app.SETTINGS.model_copy(update={"cells": 16}))
    other.configure(redis_url=module_redis_url)
    try:
        with pytest.raises(errors.RequestRefused, match="lives in 8 cells, not 16"):
            other.submit("pay", {}, operation_ref="cells/other")
    finally:
        other.close()
    assert tq.redis.hget(Keys("toolq").meta, "cells") == b"8"


def test_a_process_without_cells_is_refused_on_a_ledger_in_cells(
    tq: ToolQueue, module_redis_url: str
) -> None:
    # What a process started without TOOLQ_CELLS after `toolq cells migrate` meets:
    # refused before it writes where no other process reads, sync and async alike.
    other = cells_app.make(cells_app.SETTINGS.model_copy(update={"cells": None}))
    other.configure(redis_url=module_redis_url)
    try:
        with pytest.raises(errors.RequestRefused, match="set TOOLQ_CELLS=8"):
            other.submit("pay", {}, operation_ref="cells/none")

        async def submit_async() -> None:
            try:
                await other.aio.submit("pay", {}, operation_ref="cells/none")
            finally:
                await other.aio.aclose()

        with pytest.raises(errors.RequestRefused, match="set TOOLQ_CELLS=8"):
            asyncio.run(submit_async())
    finally:
        other.close()
    assert not tq.redis.exists(Keys("toolq").op("cells/none"))


@pytest.mark.parametrize("role", ["worker", "scheduler", "relay"])
def test_a_process_without_cells_is_refused_as_it_starts(
    tq: ToolQueue, module_redis_url: str, role: str
) -> None:
    # The same after `toolq cells migrate`, for the processes: a worker would find
    # every operation missing (its deliveries acknowledged, lost), a scheduler nothing
    # due, a relay no outbox. Each exits at start, saying what to set.
    args = [role, "--app", APP, "--redis-url", module_redis_url, "--loglevel", "WARNING"]
    if role == "relay":
        args += ["--broker-url", module_redis_url]
    p = start_toolq(
        args,
        env={"TOOLQ_DURABILITY": "none"},
        unset=["TOOLQ_CELLS"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = p.communicate(timeout=60)
    finally:
        stop_process(p, timeout=5)
    assert p.returncode not in (0, None)
    text = out.decode(errors="replace")
    assert "set TOOLQ_CELLS=8" in text and "Traceback" not in text, text


def test_a_cluster_without_cells_or_outbox_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="needs cells"):
        ToolqSettings(cluster=True, durability="none")
    with pytest.raises(ValueError, match="needs outbox mode"):
        ToolqSettings(cluster=True, cells=8, durability="none")
    assert ToolqSettings(cluster=True, cells=8, broker_url="redis://localhost/1").cluster


def test_status_sums_every_cell(tq: ToolQueue) -> None:
    # Given the calls above, succeeded in every cell
    per_cell = [tq.redis.zcard(Keys("toolq", c).index("pay", "succeeded")) for c in range(CELLS)]
    assert all(per_cell)
    # When toolq status reads the ledger
    snap = status_snapshot(tq, workers=False)
    # Then it counts what every cell holds: states and counters summed, tools united
    pay = snap["tools"]["pay"]
    assert pay["states"]["succeeded"] == sum(per_cell)
    assert pay["counters"]["succeeded"] == tq.ledger.stats()["pay|succeeded"] >= sum(per_cell)
    assert list(snap["tools"]) == ["pay"]


def test_the_charts_sample_sums_every_cell(tq: ToolQueue) -> None:
    cells = [Keys("toolq", c) for c in range(CELLS)]
    sampler = Sampler(lambda: tq.redis, Keys("toolq"), tq.clock, cells=cells)
    at = 1_000 * 60_000  # an interval long gone: no scheduler writes it
    sampler.sample(at)
    point = json.loads(tq.redis.hget(Keys("toolq").series, str(at)) or "{}")
    assert point["totals"]["succeeded"] == tq.ledger.stats()["pay|succeeded"] > 0
    assert point["totals"]["submitted"] == tq.ledger.stats()["pay|submitted"]


def _all_pages(tq: ToolQueue, **filters: object) -> tuple[list[tuple[int, str]], list[int | None]]:
    seen: list[tuple[int, str]] = []
    totals: list[int | None] = []
    cursor = None
    for _ in range(100):
        page = tq.list_operations("succeeded", limit=5, cursor=cursor, **filters)
        seen += [(item.entered_ms, item.operation_ref) for item in page.items]
        totals.append(page.total)
        cursor = page.next_cursor
        if cursor is None:
            break
    return seen, totals


def test_lists_walk_every_cell_in_order_page_by_page(tq: ToolQueue) -> None:
    indexed = {
        (int(score), ref.decode())
        for c in range(CELLS)
        for ref, score in tq.redis.zrange(
            Keys("toolq", c).index("pay", "succeeded"), 0, -1, withscores=True
        )
    }
    # oldest first, five at a time: every operation once, in (entered, ref) order
    seen, totals = _all_pages(tq)
    assert seen == sorted(indexed)
    assert set(totals) == {len(indexed)}
    # newest first: the same, reversed
    newest, _ = _all_pages(tq, newest_first=True)
    assert newest == sorted(indexed, reverse=True)
    # a filter the index does not serve: what matches, from every cell
    ok, _ = _all_pages(tq, ref_contains="cells/ok/")
    assert {ref for _, ref in ok} == {ref for _, ref in indexed if "cells/ok/" in ref}
    # the async client merges the same way
    page = asyncio.run(tq.aio.list_operations("succeeded", limit=500))
    assert [(i.entered_ms, i.operation_ref) for i in page.items] == sorted(indexed)


def test_the_search_reads_every_cell_and_pages_back(tq: ToolQueue) -> None:
    """The search box in cells mode: every state of every cell, merged in order, the
    last page without a Next, and Previous pages that walk back to the first."""
    indexed = sorted(
        (int(score), ref.decode())
        for c in range(CELLS)
        for state in ("succeeded", "queued", "escalated", "failed")
        for ref, score in tq.redis.zrange(
            Keys("toolq", c).index("pay", state), 0, -1, withscores=True
        )
        if b"cells/" in ref
    )
    assert len(indexed) > 5
    pages = []
    cursor = None
    for _ in range(100):
        page = tq.list_operations(None, search="cells/", limit=3, cursor=cursor)
        pages.append(page)
        cursor = page.next_cursor
        if cursor is None:
            break
    seen = [(i.entered_ms, i.operation_ref) for p in pages for i in p.items]
    assert seen == indexed
    assert all(p.items for p in pages)  # the last page is not an empty one
    back = pages[-1].prev_cursor
    shown_back = []
    while back is not None:
        page = tq.list_operations(None, search="cells/", limit=3, cursor=back)
        shown_back.insert(0, [i.operation_ref for i in page.items])
        back = page.prev_cursor
    assert shown_back == [[i.operation_ref for i in p.items] for p in pages[:-1]]
