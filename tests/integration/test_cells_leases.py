"""Cells mode: schedulers share the cells with a lease each, and take over the
cells of one that died (issue 18). Real scheduler processes on one server."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from tests.helpers import (
    kill_group,
    start_scheduler,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import cells_app
from toolq import ToolQueue
from toolq.core.cells import cell_of
from toolq.core.keys import Keys

CELLS = 8
ENV = {"TOOLQ_CELLS": str(CELLS), "TOOLQ_DURABILITY": "none"}


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    client = cells_app.make(cells_app.SETTINGS.model_copy(update={"cells": CELLS}))
    client.configure(redis_url=redis_url)
    yield client
    client.close()


def _holders(r: redis.Redis) -> Counter[str]:
    leases = [r.get(Keys("toolq", c).cell_lease) for c in range(CELLS)]
    return Counter(h.decode() for h in leases if h is not None)


def test_schedulers_split_the_cells_and_take_over_a_dead_ones(
    tq: ToolQueue, redis_url: str
) -> None:
    r = tq.redis
    worker = start_worker(cells_app.APP, redis_url, env=ENV)
    first = start_scheduler(cells_app.APP, redis_url, env=ENV)
    second = None
    try:
        assert wait_until(lambda: sum(_holders(r).values()) == CELLS, 20)
        second = start_scheduler(cells_app.APP, redis_url, env=ENV)
        # two live schedulers: four cells each, every cell held
        assert wait_until(lambda: sorted(_holders(r).values()) == [4, 4], 30), _holders(r)
        # When one dies without a goodbye
        kill_group(second)
        # Then the other holds every cell once the dead one's leases ran out ...
        assert wait_until(lambda: list(_holders(r).values()) == [CELLS], 30), _holders(r)
        # ... and retries calls in all of them
        one_per_cell = {cell_of(f"leases/rl/{i}", CELLS): f"leases/rl/{i}" for i in range(64)}
        refs = list(one_per_cell.values())
        assert sorted(one_per_cell) == list(range(CELLS))
        for ref in refs:
            tq.submit("pay", {"mode": "rate_limited"}, operation_ref=ref)
        for ref in refs:
            assert tq.wait(ref, timeout=30).ok
            record = tq.get(ref)
            assert record is not None and record.attempt == 3
    finally:
        stop_processes([p for p in (first, second, worker) if p is not None], timeout=5)
    # a scheduler that stops gives its cells up
    assert wait_until(lambda: not _holders(r), 5)
