"""Where each 0.1 ms of a no-op call goes, per process (issue 29, decision 0020).

    python -m bench.noop_cost [--rounds 3] [--calls 2000] [--before DIR]

The peers bench's configured toolq (``toolq worker -P asyncio -c 16`` and a scheduler,
one embedded Valkey with ``appendfsync always``): each round warms with 300 calls, then
submits ``calls`` no-op calls from this process and awaits every one, as ``python -m
bench peers`` does. CPU ms a call:

- **submitter**: its main thread by piece, from ``time.thread_time()`` around each
  (inclusive; each wrapper adds ~1 us), and its other threads (the notifier's) from /proc;
- **worker**: by thread from /proc (Celery's consumer on the main thread, the pool's event
  loop, the rest), user and system time apart;
- **server**: its CPU from /proc, and ``INFO commandstats`` before and after (us a call per
  command; FCALL's and EVALSHA's include the commands their scripts run).

``--before DIR``: the same rounds, interleaved, in an older tree (``git archive main |
tar -x -C DIR``), reported beside this one. Each run is a subprocess importing ``bench``
and ``toolq`` from its tree. Writes the section "noop-cost" of RESULTS.md.

``--submit-only``: ``tq.submit``'s own CPU, what the whole bench cannot resolve on a busy
machine: the server's answer to the SUBMIT call stubbed (``OneServer.send`` answers
"created" at once, no round trip), the best of 7 x 2,000 submits a run, each run a
subprocess of its tree, interleaved; section "noop-cost-submit".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

#: The submitter's pieces: (label, module, owner or "", attribute). Nested labels are
#: indented: an inner piece's time is part of its parent's.
PIECES = (
    ("tq.submit", "toolq.client.queue", "ToolQueue", "submit"),
    ("  App.new_operation", "toolq.client.app", "App", "new_operation"),
    (
        "    canonical_args: validate + canonical JSON",
        "toolq.decisions.operations",
        "",
        "canonical_args",
    ),
    ("    operation_ref (a new op_ uuid4)", "toolq.decisions.operations", "", "operation_ref"),
    ("    operations.new_operation", "toolq.decisions.operations", "", "new_operation"),
    (
        "      MessageFactory.run (the Celery message)",
        "toolq.adapters.broker.messages",
        "MessageFactory",
        "run",
    ),
    ("  Ledger.submit (the SUBMIT script call)", "toolq.adapters.ledger.store", "Ledger", "submit"),
    (
        "    OneServer.send (redis-py pipeline: FCALL + WAITAOF)",
        "toolq.adapters.ledger.durable",
        "OneServer",
        "send",
    ),
    ("  App.warnings_for (liveness)", "toolq.client.app", "App", "warnings_for"),
    ("tq.wait", "toolq.client.queue", "ToolQueue", "wait"),
    ("  Ledger.fields (the first read, HMGET)", "toolq.adapters.ledger.store", "Ledger", "fields"),
    (
        "  Seen.read (the record read: state, envelope)",
        "toolq.decisions.operations",
        "Seen",
        "read",
    ),
)


def thread_cpu(pid: int) -> dict[int, tuple[float, float]]:
    """(user, system) CPU seconds so far of each thread of ``pid``."""
    out: dict[int, tuple[float, float]] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(t.name)] = (int(f[11]) / tck, int(f[12]) / tck)
    return out


def one(calls: int) -> dict[str, Any]:
    """One measured run in this interpreter (its ``sys.path`` picks the tree)."""
    import importlib
    import threading
    from collections import Counter

    import redis

    from bench import procs
    from bench.peers.toolq_peer import POOL_ENV
    from bench.peers_bench import Running, valkey

    spent: Counter[str] = Counter()
    on = [False]

    def wrap(label: str, owner: Any, attr: str) -> None:
        f = getattr(owner, attr)

        def timed(*a: Any, **k: Any) -> Any:
            if not on[0] or threading.current_thread() is not threading.main_thread():
                return f(*a, **k)
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.thread_time() - t

        setattr(owner, attr, timed)

    for label, module, owner, attr in PIECES:
        m = importlib.import_module(module)
        wrap(label, getattr(m, owner) if owner else m, attr)

    os.environ[POOL_ENV] = "asyncio:16"
    with valkey(None, "always") as url:
        run = Running(url, ["toolq"], tag="noop-cost-")
        c = redis.Redis.from_url(url)
        try:
            ad = run.adapters["toolq"]
            ad.wait(ad.submit("noop", range(300)), timeout=120)
            worker = run.children["toolq"][0].pid
            server = int(c.info("server")["process_id"])
            me, main = os.getpid(), threading.get_native_id()
            k0, w0, m0 = c.info("commandstats"), thread_cpu(worker), thread_cpu(me)
            s0, load1 = procs.cpu_seconds(server), os.getloadavg()[0]
            t0 = time.perf_counter()
            on[0] = True
            failed = ad.wait(ad.submit("noop", range(calls)), timeout=600)
            on[0] = False
            secs = time.perf_counter() - t0
            k1, w1, m1 = c.info("commandstats"), thread_cpu(worker), thread_cpu(me)
            s1 = procs.cpu_seconds(server)
        finally:
            run.close()
            c.close()

    def ms(sec: float) -> float:
        return sec * 1000 / calls

    def delta(a: dict[int, tuple[float, float]], b: dict[int, tuple[float, float]]) -> Any:
        return {
            k: tuple(ms(x - y) for x, y in zip(v, a.get(k, (0, 0)), strict=True))
            for k, v in b.items()
        }

    wd, md = delta(w0, w1), delta(m0, m1)
    loops = sorted((k for k in wd if k != worker), key=lambda k: -sum(wd[k]))
    rest = [wd[k] for k in loops[1:]]
    out: dict[str, Any] = {
        "rate": calls / secs,
        "failed": failed,
        "load1": load1,
        "submitter main": sum(md.get(main, (0, 0))),
        "submitter other threads": sum(sum(v) for k, v in md.items() if k != main),
        "worker consumer (user)": wd.get(worker, (0, 0))[0],
        "worker consumer (system)": wd.get(worker, (0, 0))[1],
        "worker loop (user)": wd[loops[0]][0] if loops else 0.0,
        "worker loop (system)": wd[loops[0]][1] if loops else 0.0,
        "worker rest": sum(sum(v) for v in rest),
        "server": ms(s1 - s0),
    }
    out["submitter"] = out["submitter main"] + out["submitter other threads"]
    out["worker"] = sum(sum(v) for v in wd.values())
    out["total"] = out["submitter"] + out["worker"] + out["server"]
    for label, _, _, _ in PIECES:
        out[label] = ms(spent[label])
    for name, st in k1.items():
        n = st["calls"] - k0.get(name, {}).get("calls", 0)
        if n:
            us = st["usec"] - k0.get(name, {}).get("usec", 0)
            out[f"cmd {name.removeprefix('cmdstat_')}"] = (n / calls, us / calls)
    return out


def submit_only(calls: int) -> dict[str, Any]:
    """``tq.submit``'s CPU us a call with the server's answer stubbed (best of 7)."""
    import logging
    import timeit

    from bench import apps
    from bench.peers_bench import valkey
    from toolq.adapters.ledger import durable

    logging.disable(logging.WARNING)  # no worker runs: the liveness warning
    with valkey(None, "always") as url:
        tq = apps.tq
        tq.configure(redis_url=url)
        for i in range(50):
            tq.submit("noop", {"n": i})
        durable.OneServer.send = lambda self, commands, node: [  # type: ignore[method-assign]
            [b"created", b"queued"],
            [1, 0],
        ]
        assert tq.submit("noop", {"n": 1}).created
        times = timeit.repeat(lambda: tq.submit("noop", {"n": 7}), number=calls, repeat=7)
        tq.close()
    return {"us": min(times) / calls * 1e6, "load1": os.getloadavg()[0]}


def run_in(tree: Path, calls: int, mode: str = "--one") -> dict[str, Any]:
    """One run in a subprocess importing ``bench`` and ``toolq`` from ``tree``."""
    cmd = [sys.executable, "-P", str(HERE), mode, str(tree), "--calls", str(calls)]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(rounds: int, calls: int, before: Path | None, mode: str = "--one") -> dict[str, Any]:
    trees = {"after": ROOT} if before is None else {"before": before, "after": ROOT}
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            row = {"tree": name, "round": r, **run_in(trees[name], calls, mode)}
            rows.append(row)
            keep = ("tree", "round", "rate", "total", "us", "load1")
            print(json.dumps({k: row[k] for k in keep if k in row}))
    return {"rounds": rounds, "calls": calls, "trees": list(trees), "rows": rows}


def render_submit(res: dict[str, Any]) -> str:
    from bench.report import table

    trees = res["trees"]
    by = {t: [x["us"] for x in res["rows"] if x["tree"] == t] for t in trees}
    rows = [
        (t, f"**{statistics.median(by[t]):.1f}**", ", ".join(f"{v:.1f}" for v in by[t]))
        for t in trees
    ]
    loads = ", ".join(f"{x['load1']:.1f}" for x in res["rows"])
    return (
        "## tq.submit's own CPU, the server's answer stubbed (issue 29)\n\n"
        f"`python -m bench.noop_cost --submit-only --rounds {res['rounds']} --calls "
        f"{res['calls']}" + (" --before DIR`" if len(trees) > 1 else "`") + ": "
        "`tq.submit` of the no-op tool with `OneServer.send` answering at once (no round "
        "trip: what toolq's Python spends, not redis-py's or the server's), the best of 7 x "
        f"{res['calls']:,} a run, each run a subprocess of its tree"
        + (". " + INTERLEAVED if len(trees) > 1 else ".")
        + "\n\n"
        + table(("tree", "us a submit (median)", "per round"), rows)
        + f"\n\nload1 at each run's end: {loads}.\n"
    )


def _median(rows: list[dict[str, Any]], key: str) -> Any:
    vals = [x[key] for x in rows if key in x]
    if not vals:
        return None
    if isinstance(vals[0], list | tuple):
        return tuple(statistics.median(v[i] for v in vals) for i in range(len(vals[0])))
    return statistics.median(vals)


INTERLEAVED = "Rounds interleaved; `before`: a `git archive main` of the tree this one left. "


def render(res: dict[str, Any]) -> str:
    from bench.report import table

    trees = res["trees"]
    by = {t: [x for x in res["rows"] if x["tree"] == t] for t in trees}
    keys = [
        "total",
        "submitter",
        "submitter main",
        *(p[0] for p in PIECES),
        "submitter other threads",
        "worker",
        "worker consumer (user)",
        "worker consumer (system)",
        "worker loop (user)",
        "worker loop (system)",
        "worker rest",
        "server",
    ]
    rows = [
        (
            "· " * ((len(k) - len(k.lstrip())) // 2) + f"`{k.strip()}`",
            *(f"{_median(by[t], k):.3f}" for t in trees),
        )
        for k in keys
    ]
    cmds = sorted({k for x in res["rows"] for k in x if k.startswith("cmd ")})
    crow = []
    for k in cmds:
        med = [_median(by[t], k) for t in trees]
        if all(m is None or m[1] < 0.5 for m in med):
            continue
        crow.append((k[4:], *(f"{m[0]:.2f} x, {m[1]:.1f} us" if m else "-" for m in med)))
    rates = {t: ", ".join(f"{x['rate']:.0f}" for x in by[t]) for t in trees}
    loads = ", ".join(f"{x['load1']:.1f}" for x in res["rows"])
    totals = {t: ", ".join(f"{x['total']:.3f}" for x in by[t]) for t in trees}
    return (
        "## Where each 0.1 ms of a no-op call goes (issue 29)\n\n"
        f"`python -m bench.noop_cost --rounds {res['rounds']} --calls {res['calls']}"
        + (" --before DIR`" if len(trees) > 1 else "`")
        + ": one `toolq worker -P asyncio -c 16` and a scheduler on an embedded Valkey "
        f"(`appendfsync always`); {res['calls']:,} no-op calls submitted from the bench's "
        "process, then each awaited (`tq.submit`, then `tq.wait`), as `python -m bench "
        "peers` does. Medians of CPU ms a call; the submitter's pieces are its main "
        "thread's `thread_time()` around each (inclusive: a piece marked · is part of the one "
        "above it); the worker by thread from /proc. "
        + (INTERLEAVED if len(trees) > 1 else "")
        + "\n\n"
        + table(("CPU ms a call", *trees), rows)
        + "\n\nServer, `INFO commandstats` (calls a call, us a call; FCALL and EVALSHA "
        "include the commands their scripts run, which are also counted on their own "
        "lines):\n\n"
        + table(("command", *trees), crow)
        + "\n\n"
        + "".join(
            f"Calls/s per round, {t}: {rates[t]}; CPU ms a call: {totals[t]}.\n" for t in trees
        )
        + f"load1 at each run's start: {loads} (2 CPUs, shared with other work).\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.noop_cost")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--before", type=Path, default=None, help="an older tree, interleaved")
    ap.add_argument("--submit-only", action="store_true", help="tq.submit's own CPU")
    ap.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-submit", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None or a.one_submit is not None:
        sys.path.insert(0, str(a.one or a.one_submit))
        print(json.dumps(one(a.calls) if a.one is not None else submit_only(a.calls)))
        return 0
    from bench import report

    if a.submit_only:
        res = run(a.rounds, a.calls, a.before, "--one-submit")
        report.update("noop-cost-submit", render_submit(res), res)
        print(render_submit(res))
        return 0
    res = run(a.rounds, a.calls, a.before)
    report.update("noop-cost", render(res), res)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
