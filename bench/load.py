"""Load generators: closed loop (throughput), paced open loop (latency), batches."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadResult:
    calls: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0


def closed_loop(call: Callable[[int], None], calls: int, concurrency: int) -> LoadResult:
    """``concurrency`` threads call back to back until ``calls`` calls have returned."""
    counter = itertools.count()
    lat: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    start = threading.Barrier(concurrency + 1)

    def loop(slot: int) -> None:
        mine = lat[slot]
        start.wait()
        while True:
            i = next(counter)
            if i >= calls:
                return
            t0 = time.perf_counter()
            try:
                call(i)
            except Exception:
                errors[slot] += 1
                continue
            mine.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return LoadResult(calls, seconds, [x for xs in lat for x in xs], sum(errors))


def open_loop(
    call: Callable[[int], None], rate: float, seconds: float, max_in_flight: int = 256
) -> LoadResult:
    """Start a call every ``1/rate`` s for ``seconds``, whether or not earlier ones returned.

    Latency runs from the *scheduled* start, so a client that fell behind
    (coordinated omission) still counts the wait.
    """
    n = int(rate * seconds)
    lat: list[float] = []
    errors = 0
    lock = threading.Lock()

    def one(i: int, due: float) -> None:
        nonlocal errors
        try:
            call(i)
        except Exception:
            with lock:
                errors += 1
            return
        with lock:
            lat.append((time.perf_counter() - due) * 1000)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max_in_flight) as pool:
        for i in range(n):
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i, due)
    return LoadResult(n, time.perf_counter() - t0, lat, errors)


def batch(
    submit: Callable[[int], Any], wait: Callable[[Any], None], calls: int, concurrency: int
) -> LoadResult:
    """Many submits, then many waits: ``concurrency`` threads submit all ``calls``, then
    wait for every one (the client pattern of an agent fanning out tool calls).

    ``latencies_ms`` holds, per call, the time from the start of the run to the
    return of its wait (a batch has no per-call latency worth more than that).
    """
    handles: list[Any] = [None] * calls
    errors = [0]
    lock = threading.Lock()
    lat: list[float] = []

    def run(work: Callable[[int], None]) -> None:
        counter = itertools.count()

        def loop() -> None:
            while (i := next(counter)) < calls:
                try:
                    work(i)
                except Exception:
                    with lock:
                        errors[0] += 1

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def put(i: int) -> None:
        handles[i] = submit(i)

    def take(i: int) -> None:
        if handles[i] is None:
            return
        wait(handles[i])
        with lock:
            lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    run(put)
    run(take)
    return LoadResult(calls, time.perf_counter() - t0, lat, errors[0])
