"""The Celery app factory: safe settings, explicit queues, nothing implicit.

* JSON only, for messages, results and events.
* Late acknowledgement, requeue on worker loss, prefetch of one per pool slot
  (``worker.prefetch_multiplier``) and a small reserve (``worker.reserve``).
* One visibility timeout, set everywhere Celery and kombu read it.
* No Celery-side delays or retries of any kind: delays belong to the
  scheduler (DESIGN.md invariant 7); a test greps the package for them.
* The broker is the ledger's Redis, or ``broker_url`` (outbox mode): on
  RabbitMQ the queues are quorum queues (replicated, and Celery 5.5+ turns
  global QoS off for them) and publishes wait for the broker's confirm; a
  Redis/Valkey behind Sentinel (``sentinel://``) is found through its
  Sentinels under ``broker_master_name``, again after a failover.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from celery import Celery
from kombu import Exchange, Queue

from toolq.adapters.broker.messages import (
    RUN_TASK,
    VERIFY_TASK,
    quiet_eta_warnings,
    quiet_requeues,
)
from toolq.adapters.broker.transport import SENTINEL_TRANSPORT, TRANSPORT
from toolq.core.settings import SENTINEL_SCHEME, ToolqSettings
from toolq.process.logs import redact_worker_logs

#: The task request class of toolq's tasks (``Task.Request``; by name, so that a client
#: does not import Celery's worker modules).
REQUEST = "toolq.adapters.broker.request:Request"
#: The worker's consumer class (Celery's ``worker_consumer``; by name, for the same
#: reason), and the conf key that carries ``worker.reserve`` to it.
CONSUMER = "toolq.adapters.broker.consumer:Consumer"
RESERVE_KEY = "toolq_worker_reserve"
#: The conf key that carries ``worker.lean_success`` to the asyncio pool.
LEAN_KEY = "toolq_lean_success"
#: The conf key that carries ``worker.gc_threshold`` to the asyncio pool.
GC_KEY = "toolq_gc_threshold"

#: The schemes kombu serves with its AMQP transport (RabbitMQ).
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")


def is_amqp(url: str | None) -> bool:
    return bool(url) and str(url).startswith(AMQP_SCHEMES)


def queue_for(name: str, url: str | None) -> Queue:
    """A toolq queue, as workers consume and the relay publishes to it: a direct
    exchange of its name; on RabbitMQ a quorum queue (declared with the same
    arguments everywhere, as RabbitMQ requires of every declaration of a queue)."""
    arguments = {"x-queue-type": "quorum"} if is_amqp(url) else None
    return Queue(name, Exchange(name, type="direct"), name, queue_arguments=arguments)


def task_queues(settings: ToolqSettings, url: str | None) -> tuple[Queue, Queue]:
    q = settings.queues
    return queue_for(q.calls, url), queue_for(q.verify, url)


def celery_config(settings: ToolqSettings, url: str | None) -> dict[str, Any]:
    """Celery's settings; ``url`` is the ledger's (``settings.broker_url`` wins when set)."""
    if settings.broker_url is not None:
        url = settings.broker_url.get_secret_value()
    q = settings.queues
    transport = transport_options(settings, url)
    conf: dict[str, Any] = {
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": settings.worker.prefetch_multiplier,
        # A few messages beyond one per slot (toolq.adapters.broker.consumer).
        "worker_consumer": CONSUMER,
        RESERVE_KEY: settings.worker.reserve,
        LEAN_KEY: settings.worker.lean_success,
        GC_KEY: settings.worker.gc_threshold,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "visibility_timeout": q.visibility_timeout,
        "broker_connection_retry_on_startup": True,
        # A worker never gives up on its broker (Celery's default: after 100 tries);
        # the interval between tries is capped short by toolq's consumer
        # (toolq.adapters.broker.consumer.Consumer.ensure_connected): no Celery setting reaches
        # kombu's interval_start/step/max there, and Celery's default grows to 30 s.
        "broker_connection_max_retries": None,
        "broker_connection_retry": True,
        # A call running when the broker connection drops finishes and records its
        # outcome in the ledger; its message, unacknowledged, comes back and the
        # ledger's claim refuses it (exactly once). True would kill the call
        # mid-flight instead: an unknown outcome, a verification, for nothing.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_queues": task_queues(settings, url),
        "task_default_queue": q.calls,
        "task_routes": {RUN_TASK: {"queue": q.calls}, VERIFY_TASK: {"queue": q.verify}},
        "task_create_missing_queues": False,
        # Off unless asked (`toolq worker -E`, TOOLQ_WORKER__TASK_EVENTS): Flower needs them.
        "worker_send_task_events": settings.worker.task_events,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "broker_pool_limit": 10,
    }
    conf.update(broker_config(url))
    if settings.outbox:
        # The broker is not the ledger's server (even a redis:// one): the ledger's
        # calls cannot acknowledge its deliveries; the worker acks through the broker.
        conf["toolq_acks_in_ledger"] = False
    return conf


def transport_options(settings: ToolqSettings, url: str | None) -> dict[str, Any]:
    """kombu's transport options for the broker at ``url``: the visibility timeout
    everywhere, publisher confirms on AMQP, the messages per fetch on Redis, and on
    ``sentinel://`` the name the Sentinels know the primary by (kombu's ``master_name``)."""
    transport: dict[str, Any] = {"visibility_timeout": settings.queues.visibility_timeout}
    if is_amqp(url):
        transport["confirm_publish"] = True
    else:  # toolq's Redis transport (toolq.adapters.broker.transport)
        transport["fetch_batch"] = settings.worker.fetch_batch
    if is_sentinel(url):
        transport["master_name"] = settings.broker_master_name
    return transport


def is_redis(url: str | None) -> bool:
    """A Redis/Valkey broker named directly (not through Sentinel)."""
    return bool(url) and str(url).startswith(("redis://", "rediss://"))


def is_sentinel(url: str | None) -> bool:
    return bool(url) and str(url).startswith(SENTINEL_SCHEME)


def broker_config(url: str | None) -> dict[str, Any]:
    """The settings that follow the broker URL: set together whenever it changes.

    ``redis://`` brokers get toolq's transport (kombu's Redis transport minus a
    new client object per publish and ack); any other scheme gets kombu's own.
    A URL given after the app was built (``App.configure``: ``--redis-url``, the
    embedded server) must switch the transport too, or the fix silently is not
    used (it was not, before: 15 % of a threads-pool worker's CPU).
    """
    redis_broker = bool(url) and str(url).startswith("redis://")
    transport = TRANSPORT if redis_broker else SENTINEL_TRANSPORT if is_sentinel(url) else None
    return {
        "broker_url": kombu_url(url),
        "broker_transport": transport,
        # The ledger's server is the broker: the ledger call that ends a delivery
        # acknowledges it (toolq.adapters.broker.transport, "Acknowledged by the ledger").
        "toolq_acks_in_ledger": redis_broker,
    }


def kombu_url(url: str | None) -> str | None:
    """``url`` as kombu names it. A ledger on a unix socket (``unix:///path?db=2``, as
    redis-py names it) is ``redis+socket:///path?virtual_host=2`` to kombu, which has
    no ``unix`` transport (a KeyError from every worker on such a ledger)."""
    if not url or not url.startswith("unix://"):
        return url
    parts = urlsplit(url)
    query = urlencode([("virtual_host" if k == "db" else k, v) for k, v in parse_qsl(parts.query)])
    # By hand: urlunsplit drops the empty host ("redis+socket:/path").
    return f"redis+socket://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")


def make_celery(settings: ToolqSettings, name: str = "toolq", url: str | None = None) -> Celery:
    # A worker started as plain `celery -A module worker` redacts its logs too.
    redact_worker_logs()
    quiet_requeues()
    quiet_eta_warnings()
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings, url))
    return app
