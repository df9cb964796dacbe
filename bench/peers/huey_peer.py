"""huey 3.x at its defaults but for two worker processes: ``huey_consumer MODULE.huey -w 2
-k process``; results are stored (huey's default) and awaited with ``Result.get``."""

from __future__ import annotations

import time
from typing import Any

import redis
from huey import RedisHuey

from bench import procs
from bench.peers import crash_key, url

huey = RedisHuey("bench-peers", url=url())
_client: redis.Redis | None = None


@huey.task()
def noop(n: int) -> int:
    return n  # huey stores no None result (store_none=False): a waiter would wait forever


@huey.task()
def sleep100(n: int) -> int:
    time.sleep(0.1)
    return n


@huey.task()
def crash_write(n: int) -> int:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(url())
    time.sleep(0.05)
    _client.incr(crash_key("huey", n))
    time.sleep(0.05)
    return n


TASKS = {"noop": noop, "sleep": sleep100, "crash": crash_write}


class Adapter:
    name = "huey"
    concurrency = "2 (-w 2 -k process; huey's default is 1 thread)"

    def __init__(self, url: str) -> None:
        self.huey = huey

    def start(self, url: str, tag: str) -> list[procs.Child]:
        argv = ["-m", "huey.bin.huey_consumer", f"{__name__}.huey", "-w", "2", "-k", "process"]
        return [procs.python_child(f"peers-{tag}huey", argv, {"BENCH_PEER_URL": url})]

    def submit(self, task: str, ids: range) -> Any:
        fn = TASKS[task]
        return [fn(i) for i in ids]

    def wait(self, handles: Any, timeout: float) -> int:
        failed = 0
        for r in handles:
            try:
                # A short poll (huey's default backs off to 1 s between polls).
                r.get(blocking=True, timeout=timeout, max_delay=0.01)
            except Exception:
                failed += 1
        return failed

    def close(self) -> None:
        self.huey.storage.conn.close()
