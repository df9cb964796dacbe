"""``toolq worker``, ``toolq scheduler`` and ``toolq relay``: one role each, for real
deployments."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import click

from toolq.edges.cli.common import (
    LOGLEVEL,
    app_option,
    handle_errors,
    open_app,
    redis_option,
    state_dir_option,
)
from toolq.process.logs import install_redaction

#: ``--concurrency`` of a prefork or threads pool (processes or threads) at most.
MAX_THREADS_CONCURRENCY = 1024


def _metrics(port: int | None, tq: Any, role: str) -> None:
    if port:
        from toolq.edges.metrics import start_metrics_server

        start_metrics_server(port, tq, role=role)


def _check_queues(queues: str | None, q: Any) -> None:
    """A usage error for a name in ``--queues`` that is not one of toolq's queues (Celery
    refused it with a traceback; only toolq's tasks are routed to toolq's queues)."""
    ours = (q.calls, q.verify)
    for name in queues.split(",") if queues else ():
        if name.strip() not in ours:
            raise click.BadParameter(
                f"{name!r} is not one of this app's queues ({', '.join(ours)})",
                param_hint="'--queues'",
            )


@click.command()
@app_option
@redis_option
@state_dir_option
@click.option(
    "--queues",
    "-Q",
    default=None,
    metavar="Q1,Q2",
    help="Queues to serve (default: toolq.calls and toolq.verify).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 100_000),
    default=None,
    help="Pool size (Celery's default: the number of CPUs); with -P asyncio, the calls "
    "in flight (at most 1024 for the other pools).",
)
@click.option(
    "--pool",
    "-P",
    type=click.Choice(["prefork", "threads", "solo", "asyncio"]),
    default=None,
    help="Celery pool (default prefork; threads suits I/O-bound tools; asyncio holds "
    "thousands of async def calls in flight on one event loop).",
)
@click.option("--autoscale", default=None, metavar="MAX,MIN", help="Celery autoscaling.")
@click.option(
    "--hostname",
    "-n",
    default=None,
    help="Celery node name [default: worker.PID@HOST: unique, as RabbitMQ needs; Celery's "
    "own default, celery@HOST, is refused to a second worker on the host].",
)
@click.option(
    "--events",
    "-E",
    is_flag=True,
    help="Send Celery task events (for Flower). Off by default, as in Celery: they cost "
    "throughput, and toolq's own status and metrics do not need them "
    "(env TOOLQ_WORKER__TASK_EVENTS=1 does the same).",
)
@click.option(
    "--loglevel",
    "-l",
    type=LOGLEVEL,
    default="WARNING",
    show_default=True,
    help="As Celery's worker: WARNING says what goes wrong; INFO adds the banner and a "
    "line per task; DEBUG also each task received.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port.",
)
@handle_errors
def worker(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    queues: str | None,
    concurrency: int | None,
    pool: str | None,
    autoscale: str | None,
    hostname: str | None,
    events: bool,
    loglevel: str,
    metrics_port: int | None,
) -> None:
    """Run a Celery worker that serves toolq's queues (Celery supervises the pool)."""
    if concurrency is not None and concurrency > MAX_THREADS_CONCURRENCY and pool != "asyncio":
        raise click.BadParameter(
            f"{concurrency} is more than {MAX_THREADS_CONCURRENCY} processes or threads; "
            "-P asyncio holds more calls in flight",
            param_hint="'--concurrency'",
        )
    install_redaction()  # before Celery sets up logging: the pool's children inherit it
    from toolq.edges.stack import node_name
    from toolq.services.workers.main import run_worker

    tq = open_app(app_path, redis_url, state_dir, away="wait")
    _check_queues(queues, tq.settings.queues)
    _metrics(metrics_port, tq, "worker")
    run_worker(
        tq.celery,
        tq.registry,
        tq.settings.queues,
        queues=queues,
        concurrency=concurrency,
        pool=pool,
        autoscale=autoscale,
        loglevel=loglevel,
        hostname=hostname or node_name("worker", str(os.getpid())),
        events=events or tq.settings.worker.task_events,
    )


@click.command()
@app_option
@redis_option
@state_dir_option
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port.",
)
@click.option("--loglevel", "-l", type=LOGLEVEL, default="INFO", show_default=True)
@handle_errors
def scheduler(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    metrics_port: int | None,
    loglevel: str,
) -> None:
    """Run the scheduler: delayed retries, lease sweeps, republishing, timeouts.

    Safe to run more than one.
    """
    install_redaction()
    from toolq.services.scheduler.service import Scheduler

    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    tq = open_app(app_path, redis_url, state_dir, away="wait")
    _metrics(metrics_port, tq, "scheduler")
    on_tick = None
    if metrics_port:
        from toolq.edges.metrics import observe_tick

        on_tick = observe_tick
    sched = Scheduler(tq.app, on_tick=on_tick)

    def _stop(signum: int, frame: Any) -> None:
        sched.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        sched.run()
    finally:
        sched.close()


@click.command()
@app_option
@redis_option
@state_dir_option
@click.option(
    "--broker-url",
    envvar="TOOLQ_BROKER_URL",
    default=None,
    metavar="URL",
    help="The Celery broker to publish to: amqp://… (RabbitMQ) or a Redis of its own "
    "(env TOOLQ_BROKER_URL, better for a URL with a password: argv shows in ps; "
    "required: without it there is no outbox).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (the outbox's depth and age, relay lag).",
)
@click.option("--loglevel", "-l", type=LOGLEVEL, default="INFO", show_default=True)
@handle_errors
def relay(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path,
    broker_url: str | None,
    metrics_port: int | None,
    loglevel: str,
) -> None:
    """Publish the ledger's outbox to the Celery broker (outbox mode).

    With a broker URL set, the ledger appends every Celery message to its outbox
    stream in the same atomic step as the transition; the relay publishes each one
    (with publisher confirms on RabbitMQ), then deletes it. Entries a dead relay
    left are taken over after relay.claim_after seconds (TOOLQ_RELAY__CLAIM_AFTER).
    Safe to run more than one; stops cleanly on SIGTERM or Ctrl-C.
    """
    install_redaction()
    from toolq.services.relay.service import Relay

    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    tq = open_app(app_path, redis_url, state_dir, away="wait")
    if broker_url:
        tq.app.configure_broker(broker_url)
    if not tq.app.topology.needs_relay:
        raise click.UsageError("no broker URL: pass --broker-url or set TOOLQ_BROKER_URL")
    _metrics(metrics_port, tq, "relay")
    r = Relay(tq.app)

    def _stop(signum: int, frame: Any) -> None:
        r.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        r.run()
    finally:
        r.close()


COMMANDS = [worker, scheduler, relay]
