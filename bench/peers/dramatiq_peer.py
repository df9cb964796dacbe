"""dramatiq 2.x at its defaults: ``dramatiq MODULE --processes 2`` (8 threads each), the
Redis broker, no result backend: ``broker.join`` waits until the queue holds no message,
queued or unacknowledged (dramatiq's own way to await a queue)."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from bench import procs
from bench.peers import crash_key, url

broker = RedisBroker(url=url())
dramatiq.set_broker(broker)
_client: redis.Redis | None = None


@dramatiq.actor
def noop(n: int) -> None:
    return None


@dramatiq.actor
def sleep100(n: int) -> None:
    time.sleep(0.1)


@dramatiq.actor
def crash_write(n: int) -> None:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(url())
    time.sleep(0.05)
    _client.incr(crash_key("dramatiq", n))
    time.sleep(0.05)


ACTORS = {"noop": noop, "sleep": sleep100, "crash": crash_write}


class Adapter:
    name = "dramatiq"
    concurrency = "16 (2 processes x 8 threads)"

    def __init__(self, url: str) -> None:
        self.broker = broker

    def start(self, url: str, tag: str) -> list[procs.Child]:
        argv = ["-m", "dramatiq", __name__, "--processes", "2"]
        return [procs.python_child(f"peers-{tag}dramatiq", argv, {"BENCH_PEER_URL": url})]

    def submit(self, task: str, ids: range) -> Any:
        actor = ACTORS[task]
        for i in ids:
            actor.send(i)
        return actor.queue_name

    def wait(self, handles: Any, timeout: float) -> int:
        try:
            self.broker.join(handles, interval=10, timeout=int(timeout * 1000))
        except dramatiq.errors.QueueJoinTimeout:
            return 1
        return 0

    def close(self) -> None:
        self.broker.close()
