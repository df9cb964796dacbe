"""Where a call's CPU goes: py-spy on every process of one side while it runs.

    python -m bench.profile [--side toolq|bare] [--calls 4000] [--pool prefork]

Prints, per process role, the functions with the most samples (inclusive and
self), from py-spy's collapsed stacks (``--idle`` off: only on-CPU time).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import procs
from bench.common import server
from bench.load import closed_loop
from bench.throughput import pair

PY_SPY = str(Path(sys.executable).parent / "py-spy")


def spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            PY_SPY,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--output",
            str(out),
            "--duration",
            str(int(seconds)),
            "--rate",
            "100",
            "--nonblocking",
            "--gil",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summarize(path: Path, top: int) -> str:
    incl: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    total = 0
    if not path.exists():
        return f"(no profile at {path})"
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue  # py-spy's blank or truncated lines
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].split("/")[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        for f in set(frames):
            incl[f] += n
        self_[frames[-1]] += n
    if not total:
        return f"(no samples in {path})"
    lines = [f"  samples: {total}"]
    lines.append("  inclusive:")
    lines += [f"    {n / total:6.1%}  {f}" for f, n in incl.most_common(top)]
    lines.append("  self:")
    lines += [f"    {n / total:6.1%}  {f}" for f, n in self_.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", default="toolq", choices=("toolq", "bare"))
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--pool", default="prefork")
    ap.add_argument("-c", type=int, default=2)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--redis-url")
    a = ap.parse_args()
    out = procs.LOG_DIR / "profile"
    out.mkdir(parents=True, exist_ok=True)
    with server(a.redis_url) as srv, pair(srv.url, a.pool, a.c) as p:
        worker, scheduler, bare = p.worker, p.scheduler, p.bare
        assert worker is not None and scheduler is not None and bare is not None
        targets = {"client": os.getpid()}
        w = worker if a.side == "toolq" else bare
        for i, pid in enumerate(w.descendants() or [w.pid]):
            targets[f"worker-child{i}"] = pid
        targets["worker-parent"] = w.pid
        if a.side == "toolq":
            targets["scheduler"] = scheduler.pid
        est = 30.0
        spies = {k: spy(pid, out / f"{a.side}-{k}.txt", est) for k, pid in targets.items()}
        time.sleep(1.0)
        res = closed_loop(p.clients[a.side].call, a.calls, 32)
        print(f"{a.side}: {res.rate:.0f} calls/s during profiling")
        for s in spies.values():
            s.wait()
    for k in targets:
        print(f"== {a.side} {k}")
        print(summarize(out / f"{a.side}-{k}.txt", a.top))


if __name__ == "__main__":
    main()
