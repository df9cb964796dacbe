"""Cost of each step of a call, toolq against bare Celery, measured in one process.

    python -m bench.steps [--n 3000]

No worker and no concurrency: each step is run N times back to back against
the server, so its CPU time (``time.process_time``) and the server's time
(``INFO commandstats`` usec) are not blurred by a busy machine. The toolq
worker body is ``Runtime.run_attempt`` called directly (claim, tool, record);
the bare one is what Celery's tracer does for a result: ``backend.store_result``.
Celery's own consumer/pool costs (BRPOP, ack, events, prefork IPC) are the
same on both sides and are not here.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import redis

from bench import apps
from bench.bare_app import make_app
from bench.common import server
from bench.report import table


def _server_usec(r: redis.Redis) -> dict[str, tuple[int, int]]:
    out = {}
    for k, v in r.info("commandstats").items():
        if isinstance(v, dict):
            out[k.removeprefix("cmdstat_")] = (int(v["calls"]), int(v["usec"]))
    return out


def measure(r: redis.Redis, n: int, fn: Callable[[int], Any]) -> dict[str, Any]:
    before = _server_usec(r)
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        fn(i)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    after = _server_usec(r)
    cmds = {
        k: (after[k][0] - before.get(k, (0, 0))[0], after[k][1] - before.get(k, (0, 0))[1])
        for k in after
        if after[k][0] != before.get(k, (0, 0))[0]
    }
    cmds.pop("info", None)
    return {
        "client_cpu_us": cpu / n * 1e6,
        "wall_us": wall / n * 1e6,
        "server_us": sum(u for _, u in cmds.values()) / n,
        "commands": sum(c for c, _ in cmds.values()) / n,
        "by_command": {k: (c / n, u / n) for k, (c, u) in cmds.items()},
    }


def run(url: str, n: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    tq = apps.tq
    tq.configure(redis_url=url)
    rt = tq.runtime
    app = make_app(url)
    refs: list[str] = []
    out: dict[str, Any] = {"n": n}
    # toolq
    out["toolq.messages.run (build a Celery message)"] = measure(
        r, n, lambda i: tq.app.messages.run(f"x{i}", 1)
    )
    out["toolq submit"] = measure(
        r, n, lambda i: refs.append(tq.submit("noop", {"n": i}).operation_ref)
    )
    out["toolq worker body (run_attempt)"] = measure(r, n, lambda i: rt.run_attempt(refs[i], 1))
    out["toolq wait (already settled)"] = measure(r, n, lambda i: tq.wait(refs[i], 5))
    # bare Celery
    results: list[Any] = []
    out["bare send_task"] = measure(
        r, n, lambda i: results.append(app.send_task("bare.noop", args=[i]))
    )
    backend = app.backend
    out["bare worker result (store_result)"] = measure(
        r, n, lambda i: backend.store_result(results[i].id, None, "SUCCESS")
    )
    out["bare AsyncResult.get (already stored)"] = measure(
        r, n, lambda i: results[i].get(timeout=5)
    )
    r.delete("toolq.calls", "bare.calls")
    tq.close()
    app.close()
    return out


def render(res: dict[str, Any]) -> str:
    rows = []
    for name, m in res.items():
        if name == "n":
            continue
        top = sorted(m["by_command"].items(), key=lambda kv: -kv[1][1])[:3]
        rows.append(
            (
                name,
                f"{m['client_cpu_us']:.0f}",
                f"{m['server_us']:.0f}",
                f"{m['commands']:.1f}",
                f"{m['wall_us']:.0f}",
                ", ".join(f"{k} {c:.1f}x {u:.0f} µs" for k, (c, u) in top),
            )
        )
    return (
        f"Per step, {res['n']:,} times back to back in one process (`python -m bench.steps`): "
        "client CPU µs, server µs (commandstats), commands (counting those inside scripts), "
        "wall µs.\n\n"
        + table(("step", "CPU µs", "server µs", "commands", "wall µs", "top commands"), rows)
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--redis-url")
    a = ap.parse_args()
    with server(a.redis_url) as srv:
        res = run(srv.url, a.n)
    print(render(res))


if __name__ == "__main__":
    main()
