"""The Celery app factory: safe settings, explicit queues, nothing implicit.

* JSON only, for messages, results and events.
* Late acknowledgement, requeue on worker loss, prefetch of one.
* One visibility timeout, set everywhere Celery and kombu read it.
* No Celery-side delays or retries of any kind: delays belong to the
  scheduler (DESIGN.md invariant 7); a test greps the package for them.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from toolq.settings import ToolqSettings
from toolq.workers.messages import RUN_TASK, VERIFY_TASK
from toolq.workers.transport import TRANSPORT


def celery_config(settings: ToolqSettings, url: str | None) -> dict[str, Any]:
    q = settings.queues
    transport = {"visibility_timeout": q.visibility_timeout}
    conf: dict[str, Any] = {
        "broker_url": url,
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
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "visibility_timeout": q.visibility_timeout,
        "broker_connection_retry_on_startup": True,
        "task_queues": (
            Queue(q.calls, Exchange(q.calls, type="direct"), routing_key=q.calls),
            Queue(q.verify, Exchange(q.verify, type="direct"), routing_key=q.verify),
        ),
        "task_default_queue": q.calls,
        "task_routes": {RUN_TASK: {"queue": q.calls}, VERIFY_TASK: {"queue": q.verify}},
        "task_create_missing_queues": False,
        # Events stay on so Flower works beside toolq.
        "worker_send_task_events": True,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "broker_pool_limit": 10,
    }
    if url and url.startswith("redis://"):
        # kombu's Redis transport, minus a new client object per publish and ack.
        conf["broker_transport"] = TRANSPORT
    return conf


def make_celery(settings: ToolqSettings, name: str = "toolq", url: str | None = None) -> Celery:
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings, url))
    return app


def __getattr__(name: str) -> Any:
    """``toolq.workers.app:celery_app`` for Flower and ``celery inspect``.

    The app named by ``TOOLQ_APP`` when set (its tools registered), else a bare
    app on ``TOOLQ_REDIS_URL``: enough for Flower, which only reads events.
    """
    if name != "celery_app":
        raise AttributeError(name)
    import os

    app_path = os.environ.get("TOOLQ_APP")
    if app_path:
        from toolq.cli.common import load_app

        return load_app(app_path, os.environ.get("TOOLQ_REDIS_URL")).celery
    settings = ToolqSettings()
    return make_celery(settings, url=settings.url if settings.redis_url else None)
