"""toolq at its defaults: ``toolq worker`` (prefork, -c 2) and ``toolq scheduler``.

A configured variant, reported beside the defaults and never instead of them:
``BENCH_TOOLQ_POOL=asyncio:16`` (or ``threads:8``, any ``pool:concurrency``) runs the
worker with ``--pool asyncio -c 16``; the table's concurrency line says so.
"""

from __future__ import annotations

import os
from typing import Any

from bench import procs
from bench.clients import ToolqClient

TOOLS = {"noop": "noop", "sleep": "sleep100", "crash": "crash_write"}
APP = "bench.apps:tq"
#: The variant's environment variable: ``pool:concurrency``.
POOL_ENV = "BENCH_TOOLQ_POOL"


def pool_of(value: str | None) -> tuple[str, int]:
    """``BENCH_TOOLQ_POOL``'s pool and concurrency (unset: the defaults, prefork -c 2)."""
    if not value:
        return "prefork", 2
    pool, _, conc = value.partition(":")
    if not pool or not conc.isdigit() or int(conc) < 1:
        raise ValueError(f"{POOL_ENV}={value!r}: expected pool:concurrency, e.g. asyncio:16")
    return pool, int(conc)


class Adapter:
    name = "toolq"

    def __init__(self, url: str) -> None:
        self.pool, self.slots = pool_of(os.environ.get(POOL_ENV))
        if (self.pool, self.slots) == ("prefork", 2):
            self.concurrency = "2 (prefork -c 2, one call per process)"
        else:
            self.concurrency = f"{self.slots} (configured: --pool {self.pool} -c {self.slots})"
        self.clients = {t: ToolqClient(url, tool) for t, tool in TOOLS.items()}

    def start(self, url: str, tag: str) -> list[procs.Child]:
        base = ["-m", "toolq.edges.cli"]
        worker = [*base, "worker", "--app", APP, "--redis-url", url]
        worker += ["--pool", self.pool, "-c", str(self.slots)]
        scheduler = [*base, "scheduler", "--app", APP, "--redis-url", url]
        return [
            procs.python_child(f"peers-{tag}toolq-worker", worker),
            procs.python_child(f"peers-{tag}toolq-scheduler", scheduler),
        ]

    def submit(self, task: str, ids: range) -> Any:
        c = self.clients[task]
        return [c.submit(i) for i in ids]

    def wait(self, handles: Any, timeout: float) -> int:
        c = self.clients["noop"]
        failed = 0
        for ref in handles:
            try:
                failed += not c.tq.wait(ref, timeout=timeout).ok
            except Exception:
                failed += 1
        return failed

    def close(self) -> None:
        self.clients["noop"].close()
