"""Worker entry point: Celery stays the process supervisor."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import redis
from celery import Celery, signals

from toolq.core.settings import QueueSettings
from toolq.core.tools import Registry

log = logging.getLogger("toolq.worker")

#: ``toolq worker -P``'s names that Celery's aliases lack: the pool's dotted path, given
#: to Celery as its ``worker_pool`` setting (its ``--pool`` takes only its own names).
POOLS = {"asyncio": "toolq.services.workers.aio_pool:AsyncioPool"}

#: ``toolq worker``'s default, as Celery's own worker: a line per task is for ``-l info``.
DEFAULT_LOGLEVEL = "WARNING"


def level_of(loglevel: str) -> int:
    """A ``--loglevel`` as a number (a name in any case, or a number); unknown: INFO."""
    text = str(loglevel).strip()
    if text.isdigit():
        return int(text)
    found = logging.getLevelName(text.upper())
    return found if isinstance(found, int) else logging.INFO


def worker_argv(
    q: QueueSettings,
    *,
    queues: str | None = None,
    concurrency: int | None = None,
    pool: str | None = None,
    autoscale: str | None = None,
    loglevel: str = DEFAULT_LOGLEVEL,
    hostname: str | None = None,
    events: bool = False,
) -> list[str]:
    """Celery's argv for a toolq worker. Above INFO it is ``--quiet``: no banner (Celery
    prints its banner whatever the level; ``-l info`` shows it)."""
    quiet = ["--quiet"] if level_of(loglevel) > logging.INFO else []
    argv = [
        *quiet,
        "worker",
        "-Q",
        queues or f"{q.calls},{q.verify}",
        "--loglevel",
        loglevel,
        "--without-mingle",
        "--without-gossip",
    ]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    if pool:
        argv += ["--pool", pool]
    if autoscale:
        argv += ["--autoscale", autoscale]
    if hostname:
        argv += ["--hostname", hostname]
    if events:
        argv.append("--task-events")  # Celery's -E: for Flower
    return argv


def run_worker(celery: Celery, registry: Registry, q: QueueSettings, **options: Any) -> None:
    """Run a Celery worker for toolq's queues in the foreground. Refused
    (errors.RequestRefused) before it consumes anything if its number of cells is not
    the ledger's: without TOOLQ_CELLS on a ledger moved into cells, every claim would
    find its operation missing and the delivery would be acknowledged, lost."""
    app = getattr(celery, "toolq_app", None)
    if app is not None:
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            app.ledger.record_cells()  # a server not up yet: Celery waits for it anyway

    @signals.worker_ready.connect(weak=False)
    def _ready(sender: Any = None, **_: Any) -> None:
        registry.warn_unverifiable()
        if app is not None:
            # A server that cannot hold a claim on disk is said as the worker starts,
            # not at its first claim (toolq.adapters.ledger.durability).
            with contextlib.suppress(redis.RedisError):
                app.ledger.durable.current()

    if options.get("pool") in POOLS:
        celery.conf.worker_pool = POOLS[options["pool"]]
        options = {**options, "pool": None}
    quiet_task_received(level_of(options.get("loglevel", DEFAULT_LOGLEVEL)))
    celery.worker_main(worker_argv(q, **options))


def quiet_task_received(level: int) -> None:
    """One line per task at INFO (Celery's "succeeded in"), not two: Celery's "Task …
    received" line only at DEBUG. The strategy reads its logger's level once, when the
    consumer starts, so the quieter level also skips building the line."""
    if level > logging.DEBUG:
        logging.getLogger("celery.worker.strategy").setLevel(logging.WARNING)
