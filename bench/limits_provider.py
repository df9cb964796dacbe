"""The provider ``python -m bench limits`` calls: an HTTP server in a process of its own.

    python -m bench.limits_provider --port-file /tmp/p [--port 0]

Threaded (one thread per connection), on 127.0.0.1. It counts everything it is sent
with its own clock, so the bench judges toolq by what the provider saw:

- ``POST /call?ref=REF&write=0|1&hold=S``: one call. Refused with **429** and
  ``Retry-After`` (whole seconds, as most providers send it) when ``rate`` calls were
  already accepted in the last ``window`` seconds (a **sliding** window over the
  calls it accepted); **503** (no ``Retry-After``) while ``down``; else it holds the
  request ``hold`` seconds (a slow call) and answers 200. A 200 to ``write=1`` is a
  committed write of ``ref``.
- ``GET /committed?ref=REF``: ``{"count": n}`` (a write tool's verifier asks this).
- ``POST /_config`` (JSON: ``rate``, ``window``, ``retry_after``): set the limits and
  clear every count; ``POST /_down`` (``{"down": true|false}``): go down or come back.
- ``GET /_stats``: every request as ``[t, status, ref, pid]`` (``t`` seconds on the
  provider's monotonic clock), the most requests it held at once (``max_in_flight``),
  the in-flight curve (``[t, n]`` at each change), writes committed per ref, the
  down periods, and ``in_flight_by_pid`` (what each caller process holds now).

The judging helpers (:func:`max_in_window`, :func:`rejection_bursts`) are pure and
unit-tested in ``tests/unit/test_limits_bench_parts.py``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most of ``times`` (seconds) that fall in any half-open span ``[t, t + window)``."""
    s = sorted(times)
    best = 0
    for i, t in enumerate(s):
        best = max(best, bisect.bisect_left(s, t + window, lo=i) - i)
    return best


def rejection_bursts(statuses: Sequence[int], status: int = 429) -> list[int]:
    """Runs of ``status`` in arrival order, each ended by an answer that is not one:
    the sizes of the bursts (one burst per time the provider pushed back)."""
    bursts: list[int] = []
    run = 0
    for s in statuses:
        if s == status:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    if run:
        bursts.append(run)
    return bursts


class SlidingWindow:
    """At most ``rate`` accepted calls in any ``window`` seconds (rate 0: no limit)."""

    def __init__(self, rate: int, window: float) -> None:
        self.rate = rate
        self.window = window
        self.accepted: collections.deque[float] = collections.deque()

    def admit(self, now: float) -> float | None:
        """None when the call is accepted (and counted); else seconds until it would be."""
        if self.rate <= 0:
            return None
        while self.accepted and self.accepted[0] <= now - self.window:
            self.accepted.popleft()
        if len(self.accepted) < self.rate:
            self.accepted.append(now)
            return None
        return self.accepted[0] + self.window - now


class Provider:
    """The provider's state; every method holds the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.configure({})

    def configure(self, cfg: dict[str, Any]) -> None:
        with self.lock:
            self.limiter = SlidingWindow(int(cfg.get("rate", 0)), float(cfg.get("window", 1.0)))
            self.retry_after = float(cfg.get("retry_after", 1.0))
            self.requests: list[list[Any]] = []
            self.committed: dict[str, int] = {}
            self.in_flight = 0
            self.max_in_flight = 0
            self.curve: list[list[float]] = []
            self.by_pid: dict[str, int] = {}
            self.down = False
            self.down_periods: list[list[float | None]] = []

    def set_down(self, down: bool) -> None:
        with self.lock:
            now = time.monotonic()
            if down and not self.down:
                self.down_periods.append([now, None])
            elif not down and self.down:
                self.down_periods[-1][1] = now
            self.down = down

    def arrive(self, ref: str, pid: str) -> tuple[int, float | None]:
        """Status and Retry-After for a call arriving now; a 200 starts holding it."""
        with self.lock:
            now = time.monotonic()
            if self.down:
                status, after = 503, None
            else:
                wait = self.limiter.admit(now)
                status = 200 if wait is None else 429
                after = None if wait is None else max(self.retry_after, math.ceil(wait))
            self.requests.append([now, status, ref, pid])
            if status == 200:
                self.in_flight += 1
                self.by_pid[pid] = self.by_pid.get(pid, 0) + 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                self.curve.append([now, self.in_flight])
            return status, after

    def leave(self, ref: str, pid: str, write: bool) -> None:
        with self.lock:
            self.in_flight -= 1
            self.by_pid[pid] -= 1
            self.curve.append([time.monotonic(), self.in_flight])
            if write:
                self.committed[ref] = self.committed.get(ref, 0) + 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "now": time.monotonic(),
                "requests": list(self.requests),
                "committed": dict(self.committed),
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "curve": list(self.curve),
                "in_flight_by_pid": {p: n for p, n in self.by_pid.items() if n},
                "down": self.down,
                "down_periods": [list(p) for p in self.down_periods],
                "rate": self.limiter.rate,
                "window": self.limiter.window,
            }

    def counts(self) -> dict[str, int]:
        """The few numbers a progress line shows (cheaper than :meth:`stats`)."""
        with self.lock:
            n429 = sum(1 for r in self.requests if r[1] == 429)
            n503 = sum(1 for r in self.requests if r[1] == 503)
            return {
                "requests": len(self.requests),
                "429": n429,
                "503": n503,
                "in_flight": self.in_flight,
                "committed": sum(self.committed.values()),
            }


def _handler(p: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw else {}

        def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/_stats":
                self._reply(200, p.stats())
            elif url.path == "/_counts":
                self._reply(200, p.counts())
            elif url.path == "/committed":
                with p.lock:
                    n = p.committed.get(q.get("ref", ""), 0)
                self._reply(200, {"count": n})
            else:
                self._reply(404, {"error": "not_found"})

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            body = self._body()
            if url.path == "/_config":
                p.configure(body)
                self._reply(200, {"ok": True})
            elif url.path == "/_down":
                p.set_down(bool(body.get("down")))
                self._reply(200, {"ok": True})
            elif url.path == "/call":
                ref, pid = q.get("ref", ""), self.headers.get("X-Caller-Pid", "?")
                status, after = p.arrive(ref, pid)
                if status != 200:
                    hdrs = {} if after is None else {"Retry-After": str(int(after))}
                    self._reply(status, {"error": status}, hdrs)
                    return
                try:
                    hold = float(q.get("hold") or 0)
                    if hold > 0:
                        time.sleep(hold)
                finally:
                    p.leave(ref, pid, q.get("write") == "1")
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": "not_found"})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a killed caller resets its connection: expected here
        super().handle_error(request, client_address)


def serve(port: int = 0) -> tuple[_Server, Provider]:
    p = Provider()
    return _Server(("127.0.0.1", port), _handler(p)), p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.limits_provider")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", type=Path, required=True)
    a = ap.parse_args(argv)
    srv, _ = serve(a.port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    tmp = a.port_file.with_suffix(".tmp")
    tmp.write_text(str(srv.server_address[1]))
    tmp.replace(a.port_file)
    print(f"provider on 127.0.0.1:{srv.server_address[1]} (pid {os.getpid()})", flush=True)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
