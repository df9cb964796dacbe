"""Worker entry point: Celery stays the process supervisor."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import signals

if TYPE_CHECKING:
    from toolq.queue import ToolQueue

log = logging.getLogger("toolq.worker")


def worker_argv(
    tq: ToolQueue,
    *,
    queues: str | None = None,
    concurrency: int | None = None,
    pool: str | None = None,
    autoscale: str | None = None,
    loglevel: str = "INFO",
    hostname: str | None = None,
) -> list[str]:
    q = tq.settings.queues
    argv = [
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
    return argv


def run_worker(tq: ToolQueue, **options: Any) -> None:
    """Run a Celery worker for ``tq`` in the foreground."""
    app = tq.celery

    @signals.worker_ready.connect(weak=False)
    def _ready(sender: Any = None, **_: Any) -> None:
        tq.registry.warn_unverifiable()

    app.worker_main(worker_argv(tq, **options))
