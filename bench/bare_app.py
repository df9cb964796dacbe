"""Bare Celery, for comparison: a no-op task awaited through the Redis result backend.

Two configurations (``BENCH_BARE_CONFIG``):

- ``defaults`` (the default): Celery as ``pip install celery`` ships it (early
  acks, prefetch multiplier 4, task events off), plus the Redis result
  backend it needs to be awaited. What a user comparing the two sees.
- ``toolq``: toolq's own broker settings (``toolq.adapters.broker.app.celery_config``:
  late acks, reject on worker lost, prefetch 1, JSON, the same visibility
  timeout), so the two sides differ only in what toolq adds: the ledger
  instead of a result backend.

``BENCH_EVENTS=1`` turns task events on (on both sides: the bench's toolq
workers read it too). kombu's own Redis transport, not toolq's
one-client-per-channel subclass (``toolq.adapters.broker.transport``), unless
``BENCH_BARE_TRANSPORT=toolq`` (a what-if: bare Celery with that fix too).
toolq installs ``hiredis`` (redis-py's C parser and packer, ``redis[hiredis]``);
``pip install celery[redis]`` does not. Bare Celery runs without it, as a user
gets it, unless ``BENCH_BARE_HIREDIS=1`` (a what-if: bare Celery with hiredis
too): its connections, broker and result backend, use redis-py's pure-Python
parser and packer even where hiredis is importable (:class:`PurePythonConnection`),
so both sides can share one process and one virtualenv.
The URL comes from ``BENCH_REDIS_URL`` (``celery -A bench.bare_app:app
worker`` takes no app arguments);
``BENCH_VISIBILITY_TIMEOUT`` shortens the visibility timeout for the
countdown experiment, and ``BENCH_RESTORE_INTERVAL`` sets kombu's unacked
sweep period (``unacked_restore_interval``, throttle 1).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery
from celery.backends.redis import RedisBackend
from kombu import Exchange, Queue
from kombu.transport import redis as kombu_redis
from redis._parsers import _RESP2Parser
from redis.connection import PythonRespSerializer

from bench.procs import events_on
from toolq.adapters.broker.app import celery_config
from toolq.core.settings import QueueSettings, ToolqSettings

QUEUE = "bare.calls"
URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
VISIBILITY = int(os.environ.get("BENCH_VISIBILITY_TIMEOUT", "3600"))


def hiredis_on() -> bool:
    return os.environ.get("BENCH_BARE_HIREDIS", "") not in ("", "0")


class PurePythonConnection(redis.Connection):
    """redis-py's connection as it is without hiredis installed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["parser_class"] = _RESP2Parser  # redis-py switches it to RESP3 for protocol 3
        super().__init__(*args, **kwargs)

    def _construct_command_packer(self, packer: Any) -> Any:
        return PythonRespSerializer(self._buffer_cutoff, self.encoder.encode)


class PurePythonChannel(kombu_redis.Channel):
    connection_class = PurePythonConnection


class PurePythonTransport(kombu_redis.Transport):
    Channel = PurePythonChannel


def _pure_python_pool(self: RedisBackend, **params: Any) -> Any:
    params.setdefault("connection_class", PurePythonConnection)
    return self.ConnectionPool(**params)


if not hiredis_on():
    # Only bare Celery uses the Redis result backend in the bench's processes.
    RedisBackend._get_pool = _pure_python_pool  # type: ignore[method-assign]


def _config(url: str) -> dict[str, Any]:
    conf = _configured(url)
    if not hiredis_on() and not conf.get("broker_transport"):
        conf["broker_transport"] = "bench.bare_app:PurePythonTransport"
    return conf


def _configured(url: str) -> dict[str, Any]:
    if os.environ.get("BENCH_BARE_CONFIG", "defaults") == "defaults":
        return _defaults(url)
    settings = ToolqSettings(queues=QueueSettings(visibility_timeout=max(10, VISIBILITY)))
    try:
        conf = celery_config(settings, url)  # type: ignore[call-arg]
    except TypeError:  # the one-argument form: the URL comes from the settings
        from pydantic import SecretStr

        conf = celery_config(settings.model_copy(update={"redis_url": SecretStr(url)}))
    transport: dict[str, Any] = {"visibility_timeout": VISIBILITY}
    restore = os.environ.get("BENCH_RESTORE_INTERVAL")
    if restore:  # kombu >= 5.7: sweep the unacked set every `restore` s (default ~100 s)
        transport.update(unacked_restore_interval=int(restore), unacked_restore_throttle=1)
    if os.environ.get("BENCH_BARE_TRANSPORT") != "toolq":
        conf.pop("broker_transport", None)
    conf.update(
        broker_url=url,
        result_backend=url,
        task_ignore_result=False,
        result_expires=3600,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        visibility_timeout=VISIBILITY,
        task_queues=(Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE),),
        task_default_queue=QUEUE,
        task_routes={"bare.*": {"queue": QUEUE}},
        worker_send_task_events=events_on(),
    )
    return conf


def _defaults(url: str) -> dict[str, Any]:
    """Celery's defaults; only what a caller must set to send and await a task."""
    return {
        "broker_url": url,
        "result_backend": url,
        "task_queues": (Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE),),
        "task_default_queue": QUEUE,
        "task_routes": {"bare.*": {"queue": QUEUE}},
        "worker_send_task_events": events_on(),
        "worker_hijack_root_logger": False,
    }


_client: redis.Redis | None = None


def make_app(url: str) -> Celery:
    """A bare Celery app on ``url`` with the benchmark's tasks."""
    app = Celery("bare", set_as_current=False)
    app.conf.update(_config(url))

    @app.task(name="bare.noop")  # type: ignore[untyped-decorator]
    def noop(n: int = 0) -> None:
        return None

    @app.task(name="bare.sleep100")  # type: ignore[untyped-decorator]
    def sleep100(n: int = 0) -> None:
        time.sleep(0.1)

    @app.task(name="bare.countdown", ignore_result=True)  # type: ignore[untyped-decorator]
    def countdown(key: str, eta: float) -> None:
        """Record each execution: when, against when it was due."""
        global _client
        if _client is None:
            _client = redis.Redis.from_url(url)
        _client.rpush(f"bench:countdown:{key}", f"{time.time()}:{eta}")

    @app.task(name="bare.crash_write")  # type: ignore[untyped-decorator]
    def crash_write(n: int = 0) -> None:
        """The peers crash bench's write: a counter that never deduplicates, mid-call."""
        global _client
        from bench.peers import crash_key

        if _client is None:
            _client = redis.Redis.from_url(url)
        time.sleep(0.05)
        _client.incr(crash_key("celery", n))
        time.sleep(0.05)

    return app


app = make_app(URL)
