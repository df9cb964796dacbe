"""Where a toolq call's time goes (issue 29): py-spy on the worker, commandstats on the server.

    python -m bench.call_profile [--calls 2000] [--rounds 2] [--rate 250]

The peers bench's toolq side (``toolq worker`` prefork -c 2 and a scheduler at
their defaults, one embedded Valkey with ``appendfsync always``) runs the no-op
load (``calls`` submitted, then awaited) ``rounds`` times while py-spy samples
the worker's main process and its pool children (on-CPU samples only), and
``INFO commandstats`` is read before and after. Writes the collapsed stacks to
``bench/results/profile-worker-{main,pool}.txt`` and the breakdown (each
bucket's share of a process's samples times that process's CPU ms per call,
and the server's µs per call per command) to RESULTS.md ("Where a call's time
goes").
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import peers, procs, report
from bench.peers_bench import Running, valkey
from bench.report import table

PY_SPY = str(Path(sys.executable).parent / "py-spy")

#: (bucket, pattern over one frame "function (file:line)"); the first bucket any frame of
#: a stack matches takes the sample, so the specific come before the enclosing.
BUCKETS: tuple[tuple[str, str], ...] = (
    ("logging", r"\(logging/|\(celery/utils/log\.py"),
    ("tool (the no-op itself)", r"^noop \(bench/apps\.py"),
    ("toolq: claim", r"(^|[._])claim\w* \(toolq/"),
    ("toolq: record outcome", r"(^|[._])(record|finish|settle|complete|outcome)\w* \(toolq/"),
    ("ack (toolq ledger ack / kombu)", r"\back\w* \((toolq|kombu|celery)/|basic_ack"),
    # toolq's CLI and run_worker sit at the root of every stack of the worker they start.
    (
        "toolq: other (context, lease, heartbeat, notify)",
        r"\(toolq/(?!edges/cli/|services/workers/main)",
    ),
    ("Celery tracer", r"\(celery/app/trace\.py"),
    ("Celery request", r"\(celery/worker/request\.py"),
    ("Celery strategy (message to request)", r"\(celery/worker/strategy\.py"),
    ("pool (billiard / celery.concurrency)", r"\((billiard|celery/concurrency)/"),
    ("kombu (transport, messages)", r"\(kombu/"),
    ("redis-py (outside the above)", r"\((redis|hiredis)/"),
    # The consumer's loop is the root of the main process's stacks: what is left of it.
    ("Celery consumer loop (the rest)", r"\(celery/worker/"),
    ("Celery other", r"\(celery/"),
)


def spy(pid: int, out: Path, rate: int) -> subprocess.Popen[bytes]:
    argv = [PY_SPY, "record", "--pid", str(pid), "--format", "raw", "--output", str(out)]
    argv += ["--rate", str(rate), "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def buckets(path: Path) -> tuple[collections.Counter[str], int]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    if not path.exists():
        return counts, 0
    rules = [(name, re.compile(p)) for name, p in BUCKETS]
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";")]
        total += int(n)
        for name, rx in rules:
            if any(rx.search(f) for f in frames):
                counts[name] += int(n)
                break
        else:
            counts["other (interpreter, stdlib)"] += int(n)
    return counts, total


def _short(frame: str) -> str:
    """``fn (/path/site-packages/pkg/mod.py:12)`` -> ``fn (pkg/mod.py:12)``."""
    return re.sub(r"\(.*?(site-packages/|wt-[\w-]+/|/work/[\w-]+/)", "(", frame)


#: Where a worker process's loops start (the consumer's event loop, a pool child's loop,
#: a thread's run): frames above them are bootstrap.
LOOP_ROOTS = ("asynloop (", "Worker.workloop (", "Thread.run (")


def normalize(path: Path) -> None:
    """Collapsed stacks of one process, small and machine-neutral: paths cut to the
    package, line numbers dropped, equal stacks merged; py-spy's ``process N`` frames
    dropped, and with them stacks of any child process (they are sampled on their own)."""
    if not path.exists():
        return
    merged: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        procs_ = [f for f in frames if f.startswith("process ")]
        if len(procs_) > 1:
            continue
        frames = [
            re.sub(r":\d+\)$", ")", _short(f)) for f in frames if not f.startswith("process ")
        ]
        # The bootstrap (runpy, click, the CLI, Celery's worker start) is the same on every
        # stack above the loops: cut it, so the file stays small.
        roots = [i for i, f in enumerate(frames) if f.startswith(LOOP_ROOTS)]
        if roots:
            frames = ["..", *frames[roots[0] :]]
        merged[";".join(frames)] += int(n)
    path.write_text("".join(f"{st} {k}\n" for st, k in merged.most_common()))


def innermost(path: Path, top: int = 8) -> dict[str, int]:
    """Samples by the innermost library frame (kombu, celery, billiard, redis-py, toolq):
    where the CPU is spent, whoever called it (epoll, a socket write, a pipe write)."""
    c: collections.Counter[str] = collections.Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if n.isdigit():
                lib = [f for f in stack.split(";") if re.search(LIBS, f)]
                c[lib[-1] if lib else "(interpreter, stdlib)"] += int(n)
    return dict(c.most_common(top))


LIBS = r"\((kombu|celery|billiard|redis|toolq|bench)/"


def rebucket(main: Path, pool: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role, path in (("main", main), ("pool", pool)):
        cnt, total = buckets(path)
        out[role] = {"samples": total, "counts": dict(cnt), "innermost": innermost(path)}
    return out


def cmdstats(c: redis.Redis) -> dict[str, tuple[int, float]]:
    raw = c.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
        for k, v in raw.items()
        if isinstance(v, dict)
    }


def run(calls: int, rounds: int, rate: int, out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"calls": calls, "rounds": rounds, "rate": rate}
    with valkey(None, "always") as url:
        c = redis.Redis.from_url(url)
        run_ = Running(url, ["toolq"], tag="prof-")
        try:
            ad = run_.adapters["toolq"]
            ad.wait(ad.submit("noop", range(200)), timeout=120)
            worker = run_.children["toolq"][0]
            server_pid = int(c.info("server")["process_id"])
            pool = worker.descendants()
            files = {"main": out_dir / "profile-worker-main.txt"}
            files.update(
                {f"pool{i}": out_dir / f"profile-worker-pool{i}.raw" for i in range(len(pool))}
            )
            pids = {"main": worker.pid, **{f"pool{i}": p for i, p in enumerate(pool)}}
            cpu0 = {k: procs.cpu_seconds(p) for k, p in pids.items()}
            cpu0["server"] = procs.cpu_seconds(server_pid)
            cpu0["scheduler"] = procs.group_cpu(run_.children["toolq"][1])
            st0 = cmdstats(c)
            spies = [spy(pids[k], files[k], rate) for k in pids]
            time.sleep(1.0)
            t0 = time.perf_counter()
            for _ in range(rounds):
                ad.wait(ad.submit("noop", range(calls)), timeout=300)
            secs = time.perf_counter() - t0
            for s in spies:
                s.send_signal(signal.SIGINT)
            for s in spies:
                s.wait(timeout=30)
            st1 = cmdstats(c)
            n = calls * rounds
            cpu1 = {k: procs.cpu_seconds(p) for k, p in pids.items()}
            cpu1["server"] = procs.cpu_seconds(server_pid)
            cpu1["scheduler"] = procs.group_cpu(run_.children["toolq"][1])
        finally:
            run_.close()
            c.close()
    res["rate"] = n / secs
    res["cpu_ms"] = {k: (cpu1[k] - cpu0[k]) * 1000 / n for k in cpu0}
    res["cpu_ms"]["pool"] = sum(v for k, v in res["cpu_ms"].items() if k.startswith("pool"))
    # One collapsed file for the pool children (they run the same code).
    merged: collections.Counter[str] = collections.Counter()
    for k, f in files.items():
        if k.startswith("pool") and f.exists():
            for line in f.read_text().splitlines():
                stack, _, cnt = line.rpartition(" ")
                if cnt.isdigit():
                    merged[stack] += int(cnt)
            f.unlink()
    pool_file = out_dir / "profile-worker-pool.txt"
    pool_file.write_text("".join(f"{s} {k}\n" for s, k in merged.most_common()))
    normalize(files["main"])
    normalize(pool_file)
    res["buckets"] = rebucket(files["main"], pool_file)
    res["commands"] = {
        k: {
            "per_call": (st1[k][0] - st0.get(k, (0, 0))[0]) / n,
            "usec_per_call": (st1[k][1] - st0.get(k, (0, 0))[1]) / n,
        }
        for k in st1
        if st1[k][0] - st0.get(k, (0, 0))[0] > 0
    }
    return res


def render(res: dict[str, Any]) -> str:
    rows = []
    for role, label in (("main", "worker main process"), ("pool", "pool children")):
        b = res["buckets"][role]
        ms = res["cpu_ms"][role]
        for name, cnt in sorted(b["counts"].items(), key=lambda kv: -kv[1]):
            share = cnt / b["samples"] if b["samples"] else 0.0
            rows.append((label, name, f"{share:.0%}", f"{ms * share:.3f}"))
        rows.append((label, "**all**", "100%", f"**{ms:.3f}**"))
    inner = []
    for role, label in (("main", "worker main process"), ("pool", "pool children")):
        b = res["buckets"][role]
        for frame, cnt in b.get("innermost", {}).items():
            share = cnt / b["samples"] if b["samples"] else 0.0
            inner.append(
                (label, f"`{frame}`", f"{share:.0%}", f"{res['cpu_ms'][role] * share:.3f}")
            )
    cmd_rows = [
        (k, f"{v['per_call']:.2f}", f"{v['usec_per_call']:.1f}")
        for k, v in sorted(res["commands"].items(), key=lambda kv: -kv[1]["usec_per_call"])
        if v["usec_per_call"] >= 0.5 or v["per_call"] >= 0.05
    ]
    total_us = sum(v["usec_per_call"] for v in res["commands"].values())
    cpu = res["cpu_ms"]
    return (
        "## Where a call's time goes (toolq worker, no-op)\n\n"
        f"`python -m bench.call_profile`: {res['calls']:,} no-op calls submitted then awaited, "
        f"x {res['rounds']}, through `toolq worker` (prefork -c 2) and a scheduler at their "
        f"defaults on an embedded Valkey (`appendfsync always`), {res['rate']:.0f} calls/s "
        f"while py-spy sampled the worker's processes ({res['rate_hz']} Hz, on-CPU samples "
        "only, `--nonblocking`). Each bucket's CPU ms per call = its share of the process's "
        "samples x the process's CPU ms per call (from /proc). A sample goes to the first "
        "bucket any of its frames matches, in the order of `BUCKETS` in the module (so "
        "redis-py time inside toolq's claim counts as the claim). CPU ms per call: worker "
        f"main {cpu['main']:.3f}, pool children {cpu['pool']:.3f}, scheduler "
        f"{cpu['scheduler']:.3f}, server {cpu['server']:.3f}. Collapsed stacks: "
        "`bench/results/profile-worker-main.txt`, `profile-worker-pool.txt`.\n\n"
        + table(("process", "bucket", "share of samples", "CPU ms per call"), rows)
        + "\n\nThe same samples by the innermost frame of kombu, Celery, billiard, redis-py or "
        "toolq on the stack (what is on the CPU, whoever asked for it):\n\n"
        + table(("process", "innermost library frame", "share", "CPU ms per call"), inner)
        + f"\n\nServer: `INFO commandstats` around the run, µs per call by command "
        f"(commands run inside the scripts are counted in FCALL's time and listed again; the "
        f"top-level ones (FCALL, EXEC, BRPOP, LPUSH, ...) are what the server spent; "
        f"every row summed {total_us:.0f} µs):\n\n"
        + table(("command", "per call", "µs per call"), cmd_rows)
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.call_profile")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    assert peers.available("toolq")
    res = run(a.calls, a.rounds, a.rate, report.RAW)
    res["rate_hz"] = a.rate
    report.update("profile", render(res), res)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
