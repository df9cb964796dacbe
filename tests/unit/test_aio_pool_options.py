"""``toolq worker -P asyncio`` (issue 29): how the pool is named and asked for, without a
server. Its behaviour with real workers: tests/integration/test_aio_pool.py."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from celery import Celery, signals
from click.testing import CliRunner

from toolq.adapters.broker.app import celery_config
from toolq.adapters.liveness import _pool_name
from toolq.core.settings import ToolqSettings, WorkerSettings
from toolq.edges.cli import main
from toolq.services.workers import main as worker_main
from toolq.services.workers.aio_pool import (
    DOTTED,
    AsyncioPool,
    _task_signal_receivers,
    traced_inline,
)

URL = "redis://h:6379/0"


def test_more_than_1024_slots_are_refused_to_the_other_pools() -> None:
    result = CliRunner().invoke(main, ["worker", "-P", "threads", "-c", "2000"])
    assert result.exit_code == 2
    assert "-P asyncio holds more calls in flight" in result.output


def test_the_asyncio_pool_is_given_to_celery_as_its_worker_pool(monkeypatch: Any) -> None:
    celery = Celery("t")
    seen: list[list[str]] = []
    monkeypatch.setattr(celery, "worker_main", lambda argv: seen.append(argv))
    q = worker_main.QueueSettings()
    worker_main.run_worker(celery, worker_main.Registry(), q, pool="asyncio", concurrency=2000)
    # Celery's --pool takes only its own names: the dotted path goes in its setting
    assert celery.conf.worker_pool == DOTTED
    assert "--pool" not in seen[0] and seen[0][seen[0].index("--concurrency") + 1] == "2000"


def test_the_pool_reports_its_slots_and_its_name() -> None:
    pool = AsyncioPool(limit=2000)
    assert pool.num_processes == 2000 and pool.threads == 64
    assert _pool_name(pool) == "asyncio"
    assert pool.info["max-concurrency"] == 2000
    # a tracer's arguments for a task that is not toolq's: run on the threads
    assert pool._bodies_of(("other.task", "id", {}, b"", None, None)) is None


@pytest.mark.parametrize(
    ("returned", "receivers", "hub", "running", "inline"),
    [
        (True, False, True, 16, True),  # the usual call: the tracer is short, no hop
        (True, True, True, 16, False),  # a task-signal receiver is user code: on a thread
        (False, False, True, 16, False),  # a body that raised: a traceback to format
        (True, False, False, 16, False),  # no hub: the tracer's thread sends the ack itself
        (True, False, True, 17, False),  # more calls than threads: the loop is the busiest
        (False, True, False, 17, False),
    ],
)
def test_where_celerys_tracer_runs(
    returned: bool, receivers: bool, hub: bool, running: int, inline: bool
) -> None:
    assert traced_inline(returned, receivers, hub, running, threads=16) is inline


def test_a_task_signal_receiver_is_seen() -> None:
    assert not _task_signal_receivers()

    def receiver(**_: Any) -> None: ...

    signals.task_postrun.connect(receiver, weak=False)
    try:
        assert _task_signal_receivers()
    finally:
        signals.task_postrun.disconnect(receiver)
    assert not _task_signal_receivers()


def test_the_tracer_stays_on_threads_until_celerys_consumer_registers_its_hub() -> None:
    pool = AsyncioPool(limit=1)
    assert not pool._hub
    pool.register_with_event_loop(object())
    assert pool._hub


@pytest.mark.parametrize(("setting", "raised"), [(10_000, True), (0, False)])
def test_the_pool_raises_the_collectors_first_threshold_while_it_runs(
    setting: int, raised: bool
) -> None:
    """``worker.gc_threshold``: thousands of calls taken at once ran a full collection
    at each step of the heap's growth (toolq.core.settings)."""
    app = Celery("t", set_as_current=False)
    app.conf.update(celery_config(ToolqSettings(worker=WorkerSettings(gc_threshold=setting)), URL))
    before = gc.get_threshold()
    pool = AsyncioPool(limit=4, app=app)
    pool.on_start()
    try:
        during = gc.get_threshold()
        assert pool.info["gc-threshold"] == setting
    finally:
        pool.on_stop()
    assert during == ((setting, *before[1:]) if raised else before)
    assert gc.get_threshold() == before  # put back when the pool stops


def test_the_delivery_tag_reads_the_ack_setting_once() -> None:
    """The tag the ledger acknowledges with, at every call; whether the ledger
    acknowledges is the app's setting, read at the first call only."""
    from toolq.adapters.broker.ack import SETTING

    class Conf(dict[str, Any]):
        reads = 0

        def get(self, key: str, default: Any = None) -> Any:
            if key == SETTING:
                Conf.reads += 1
            return super().get(key, default)

    class App:
        conf = Conf({SETTING: True})

    pool = AsyncioPool(limit=1)
    pool.app = App()
    request = {"delivery_info": {"delivery_tag": "t1"}}
    assert [pool._delivery(request) for _ in range(3)] == ["t1", "t1", "t1"]
    assert pool._delivery({}) is None
    assert Conf.reads == 1
