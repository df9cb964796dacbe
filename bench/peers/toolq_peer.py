"""toolq at its defaults: ``toolq worker`` (prefork, -c 2) and ``toolq scheduler``."""

from __future__ import annotations

from typing import Any

from bench import procs
from bench.clients import ToolqClient

TOOLS = {"noop": "noop", "sleep": "sleep100", "crash": "crash_write"}
APP = "bench.apps:tq"


class Adapter:
    name = "toolq"
    concurrency = "2 (prefork -c 2, one call per process)"

    def __init__(self, url: str) -> None:
        self.clients = {t: ToolqClient(url, tool) for t, tool in TOOLS.items()}

    def start(self, url: str, tag: str) -> list[procs.Child]:
        base = ["-m", "toolq.edges.cli"]
        worker = [*base, "worker", "--app", APP, "--redis-url", url, "--pool", "prefork", "-c", "2"]
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
