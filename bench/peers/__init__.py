"""The peers bench's systems: one small module each (its worker command, submit, wait).

Every module defines its tasks at import (the worker imports it too), reading
the server from ``BENCH_PEER_URL``, and an adapter class with

* ``start(url)``: the worker processes, at the system's defaults (2 processes);
* ``submit(task, ids)`` then ``wait(handles)``: enqueue, then block until every
  one ran (``task`` is ``noop``, ``sleep`` (100 ms) or ``crash`` (a counter write
  between two 50 ms sleeps, :data:`CRASH_KEY`));
* ``concurrency``: what the defaults give (calls in flight over both processes).

The peers are dev-only dependencies (the ``bench`` extra); a missing one is
reported by :func:`available`, never installed at run time.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the arq worker imports this package from a venv without toolq
    from bench import procs

#: The systems, in table order; ``celery`` is the reference the ratios are taken against.
SYSTEMS = ("celery", "toolq", "dramatiq", "huey", "saq", "arq")
#: The package each adapter needs (``celery`` and ``toolq`` are toolq's own dependencies).
PACKAGES = {"celery": "celery", "toolq": "toolq", "dramatiq": "dramatiq", "huey": "huey",
            "saq": "saq", "arq": "arq"}  # fmt: skip
#: The provider that never deduplicates: one counter per call; 2 is a doubled write.
CRASH_KEY = "bench:peers:crash:{system}:{n}"
TASKS = ("noop", "sleep", "crash")


def url() -> str:
    return os.environ.get("BENCH_PEER_URL", "redis://127.0.0.1:6379/0")


#: A configured variant for the asyncio-pool bench's peers (never their default): the
#: garbage collector's first threshold in their worker processes, as toolq's
#: ``worker.gc_threshold`` sets it on ``-P asyncio`` (CPython's default is 700).
GC_THRESHOLD_ENV = "BENCH_PEER_GC_THRESHOLD"


def gc_threshold_from_env() -> None:
    """Set the collector's first threshold from :data:`GC_THRESHOLD_ENV`, if given."""
    import gc

    if given := os.environ.get(GC_THRESHOLD_ENV):
        gc.set_threshold(int(given), *gc.get_threshold()[1:])


def crash_key(system: str, n: int) -> str:
    return CRASH_KEY.format(system=system, n=n)


class Peer(Protocol):
    name: str
    #: calls in flight at the defaults, over both worker processes, and how
    concurrency: str

    def start(self, url: str, tag: str) -> list[procs.Child]: ...

    def submit(self, task: str, ids: range) -> Any: ...

    def wait(self, handles: Any, timeout: float) -> int:
        """Block until every call ran; the number that failed or timed out."""
        ...

    def close(self) -> None: ...


def available(name: str) -> bool:
    if name == "arq":  # arq 0.28 pins redis < 6: it runs from a venv of its own
        from bench.peers.arq_peer import arq_python

        return arq_python() is not None
    return importlib.util.find_spec(PACKAGES[name]) is not None


def make(name: str, server_url: str) -> Peer:
    """The adapter of ``name``; every module reads the server from ``BENCH_PEER_URL``."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; one of {', '.join(SYSTEMS)}")
    os.environ["BENCH_PEER_URL"] = server_url
    module = importlib.import_module(f"bench.peers.{name}_peer")
    peer: Peer = module.Adapter(server_url)
    return peer


def peer_env(server_url: str) -> dict[str, str]:
    return {"BENCH_PEER_URL": server_url}
