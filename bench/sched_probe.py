"""Run one toolq scheduler and record what it did (a child of ``bench.scheduler_bench``).

    python -m bench.sched_probe --url URL --out FILE [--seconds S | --until N]

Runs :class:`toolq.services.scheduler.service.Scheduler` for the bench app with an
``on_tick`` hook that keeps every dispatch lag (``TickStats.lags_ms``) and the
time and size of every tick, samples this process's RSS, and writes it all as
JSON when it stops: after ``--seconds``, or once ``--until`` transitions have
been applied.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from bench import apps
from bench.procs import rss_kb
from toolq.services.scheduler.service import Scheduler, TickStats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--until", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--ready", type=Path, help="file written once the scheduler is about to run")
    a = ap.parse_args()

    tq = apps.tq
    tq.configure(redis_url=a.url)
    lags: list[int] = []
    ticks: list[tuple[float, int, int]] = []
    applied = 0
    rss: list[int] = [rss_kb(os.getpid())]
    done = threading.Event()

    def on_tick(st: TickStats) -> None:
        nonlocal applied
        applied += st.applied
        lags.extend(st.lags_ms)
        ticks.append((time.time(), st.taken, st.applied))
        if a.until and applied >= a.until:
            done.set()

    sched = Scheduler(tq.app, on_tick=on_tick)
    tq.redis.ping()
    tq.app.messages  # noqa: B018 - build the Celery app before the clock starts

    def sample() -> None:
        while not done.wait(0.25):
            rss.append(rss_kb(os.getpid()))

    def stopper() -> None:
        done.wait(a.seconds if a.seconds else a.timeout)
        done.set()
        sched.stop()
        # Wake a sleeping scheduler so it sees the stop at once.
        tq.redis.lpush(tq.ledger.keys.wake, "1")

    threading.Thread(target=sample, daemon=True).start()
    threading.Thread(target=stopper, daemon=True).start()
    t0 = time.time()
    if a.ready is not None:
        a.ready.write_text(str(t0))
    sched.run()
    rss.append(rss_kb(os.getpid()))
    out: dict[str, Any] = {
        "t0": t0,
        "t_end": time.time(),
        "applied": applied,
        "lags_ms": lags,
        "ticks": ticks,
        "rss_kb": rss,
    }
    a.out.write_text(json.dumps(out))
    sched.close()


if __name__ == "__main__":
    main()
