"""The server's cost per call: toolq against bare Celery on one Valkey (issue 14).

    python -m bench server [--server-calls 2000 --server-rounds 2]

What says when a user outgrows one server. Both sides run side by side on the
same embedded Valkey (toolq: a worker and a scheduler, as deployed; bare
Celery: a worker and the Redis result backend it needs to be awaited), rounds
alternate A B; before each side's run the server's counters are reset
(``CONFIG RESETSTAT``). Each run submits N no-op calls, then awaits them all.
Read from the server after the run:

- ``INFO commandstats``: commands per call, and per command its calls and µs
  per call (commands that scripts run are counted too, and inside the script's
  own time);
- ``INFO cpu``: the server process's CPU (``used_cpu_sys + used_cpu_user``)
  per call, whatever it was spent on (commands, Lua, sockets, Pub/Sub);
- the single-server ceiling that implies: 1 / server CPU per call. The box is
  shared with the workers and the client, so absolute figures are high; the
  ratio is the point.

Then, toolq alone in this process (no worker, no concurrency: the three
script calls of a call, each N times back to back), what each script runs
inside the server: its commands, its own µs and its CPU per call.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench.common import fmt, median
from bench.load import batch
from bench.report import table
from bench.throughput import SIDES, pair

#: Client threads submitting, then waiting (the issue's measurement: one client process).
CONCURRENCY = 16


def server_cpu(r: redis.Redis) -> float:
    """CPU seconds the server process has used (user + system)."""
    c = r.info("cpu")
    return float(c["used_cpu_sys"]) + float(c["used_cpu_user"])


def command_table(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats`` as {command: (calls, usec)}, without this bench's own reads."""
    out = {}
    for key, val in r.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if isinstance(val, dict) and name not in ("info", "config|resetstat"):
            out[name] = (int(val["calls"]), int(val["usec"]))
    return out


def measured(r: redis.Redis, n: int, fn: Any) -> dict[str, Any]:
    """Reset the server's counters, run ``fn``, and read them per call."""
    r.config_resetstat()
    cpu0, t0 = server_cpu(r), time.perf_counter()
    extra = fn()
    seconds = time.perf_counter() - t0
    cpu_us = (server_cpu(r) - cpu0) / n * 1e6
    cmds = command_table(r)
    return {
        "seconds": seconds,
        "server_cpu_us": cpu_us,
        "commands": sum(c for c, _ in cmds.values()) / n,
        "by_command": {k: (c / n, u / n) for k, (c, u) in cmds.items()},
        **(extra or {}),
    }


def side_by_side(url: str, calls: int, rounds: int, pool: str, conc: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    idle: list[float] = []
    with pair(url, pool, conc, tag="srv-") as p:
        for i in range(rounds):
            # What the idle processes (pollers, heartbeats) cost the server, per second.
            c0 = server_cpu(r)
            time.sleep(1.0)
            idle.append((server_cpu(r) - c0) * 1e6)
            for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                client = p.clients[side]

                def run(client: Any = client) -> dict[str, Any]:
                    res = batch(client.submit, client.wait, calls, CONCURRENCY)
                    return {"rate": res.rate, "errors": res.errors}

                m = measured(r, calls, run)
                runs[side].append(m)
                print(
                    f"  [server {pool}] round {i + 1}/{rounds} {side:5s} "
                    f"{m['server_cpu_us']:6.1f} µs server CPU/call, "
                    f"{m['commands']:.1f} commands/call, {m['rate']:.0f} calls/s",
                    flush=True,
                )
    r.close()
    return {"runs": runs, "idle_us_per_s": median(idle)}


def per_script(url: str, n: int) -> dict[str, Any]:
    """toolq's three script calls of a call, each ``n`` times back to back in this process."""
    from bench import apps
    from toolq.decisions.recovery import outcome

    tq = apps.tq
    tq.configure(redis_url=url)
    r = redis.Redis.from_url(url)
    ledger, policy = tq.ledger, tq.app.policy
    tool = tq.registry.get("noop")
    holder = "bench:1:x:1"
    refs: list[str] = []
    claims: list[Any] = []

    def submits() -> None:
        refs.extend(tq.submit("noop", {"n": i}).operation_ref for i in range(n))

    def claim() -> None:
        now = tq.app.now_ms()
        claims.extend(ledger.claim(ref, 1, holder, now, 30_000, "run") for ref in refs)

    def record() -> None:
        now = tq.app.now_ms()
        for ref, c in zip(refs, claims, strict=True):
            a = outcome.Attempt(
                ref=ref, tool=tool, call_id=c.call_id, attempt=1, max_attempts=c.max_attempts,
                deadline_ms=c.deadline_ms, fp=c.fp, vcheck=c.vcheck, holder=holder,
            )  # fmt: skip
            ledger.apply_one(outcome.after_success(a, {}, now, policy), now)

    def wait() -> None:
        for ref in refs:
            tq.wait(ref, timeout=5)

    out = {
        "submit": measured(r, n, submits),
        "claim": measured(r, n, claim),
        "record (success)": measured(r, n, record),
        "wait (settled)": measured(r, n, wait),
    }
    r.delete(tq.settings.queues.calls)
    r.close()
    return {"n": n, "steps": out}


def run(url: str, calls: int, rounds: int, pools: list[tuple[str, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": calls, "rounds": rounds, "pools": {}}
    for pool, conc in pools:
        print(f"server: {pool} -c {conc}, {calls} calls x {rounds} rounds", flush=True)
        out["pools"][f"{pool} -c {conc}"] = side_by_side(url, calls, rounds, pool, conc)
    print(f"server: per script, {calls} each", flush=True)
    out["scripts"] = per_script(url, calls)
    return out


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "cpu": median([r["server_cpu_us"] for r in runs]),
        "cmds": median([r["commands"] for r in runs]),
        "rate": median([r["rate"] for r in runs]),
    }


def render(res: dict[str, Any]) -> str:
    rows = []
    for pool, pr in res["pools"].items():
        s = {side: _summary(pr["runs"][side]) for side in SIDES}
        for side in SIDES:
            cpus = ", ".join(f"{r['server_cpu_us']:.0f}" for r in pr["runs"][side])
            rows.append(
                (
                    pool,
                    side,
                    f"{s[side]['cmds']:.1f}",
                    f"**{s[side]['cpu']:.0f}** ({cpus})",
                    f"{1e6 / s[side]['cpu']:,.0f}",
                    fmt(s[side]["rate"], 0),
                )
            )
        ratio = s["toolq"]["cpu"] / s["bare"]["cpu"]
        rows.append((pool, "**toolq / bare**", "", f"**{ratio:.2f}**", "", ""))
    parts = [
        "## Server cost per call\n",
        f"`python -m bench server`: {res['calls']:,} no-op calls submitted (16 client threads), "
        f"then awaited, per run; {res['rounds']} rounds A B on one embedded Valkey, counters "
        "reset before each side's run. Server CPU is `INFO cpu` (user + system) of the server "
        "process over the run, per call; the ceiling is 1 / that (the box is shared with the "
        "workers and the client: the ratio is the point). Idle cost (pollers, heartbeats) is "
        "included; measured alone it was "
        + ", ".join(
            f"{pr['idle_us_per_s'] / 1000:.1f} ms/s ({pool})" for pool, pr in res["pools"].items()
        )
        + ".\n",
        table(
            (
                "pool",
                "side",
                "commands/call",
                "server CPU µs/call (runs)",
                "implied ceiling calls/s",
                "calls/s",
            ),
            rows,
        ),
    ]
    for pool, pr in res["pools"].items():
        per = {}
        for side in SIDES:
            names = {k for r in pr["runs"][side] for k in r["by_command"]}
            per[side] = {
                k: (
                    median([r["by_command"].get(k, (0, 0))[0] for r in pr["runs"][side]]),
                    median([r["by_command"].get(k, (0, 0))[1] for r in pr["runs"][side]]),
                )
                for k in names
            }
        top = sorted(
            set(per["toolq"]) | set(per["bare"]),
            key=lambda k: -(per["toolq"].get(k, (0, 0))[1] + per["bare"].get(k, (0, 0))[1]),
        )
        rows = []
        for k in top:
            t, b = per["toolq"].get(k, (0.0, 0.0)), per["bare"].get(k, (0.0, 0.0))
            if max(t[0], b[0]) < 0.005:
                continue
            rows.append((k, f"{t[0]:.2f}", f"{t[1]:.1f}", f"{b[0]:.2f}", f"{b[1]:.1f}"))
        parts.append(
            f"\nPer command, {pool} (medians; µs are the command's own time per call of the "
            "bench, a script's include the commands it runs):\n\n"
            + table(("command", "toolq calls", "toolq µs", "bare calls", "bare µs"), rows)
        )
    sc = res["scripts"]
    rows = []
    for name, m in sc["steps"].items():
        own = {k: v for k, v in m["by_command"].items() if k not in ("evalsha", "fcall")}
        script = sum(u for k, (_, u) in m["by_command"].items() if k in ("evalsha", "fcall"))
        inner = sum(u for _, u in own.values())
        listing = ", ".join(
            f"{k} {c:.0f}" if c == int(c) else f"{k} {c:.2f}"
            for k, (c, _) in sorted(own.items(), key=lambda kv: -kv[1][0])
        )
        rows.append(
            (
                name,
                f"{m['server_cpu_us']:.0f}",
                f"{script:.0f}" if script else "-",
                f"{inner:.0f}",
                f"{script - inner:.0f}" if script else "-",
                listing,
            )
        )
    parts.append(
        f"\ntoolq per script call, {sc['n']:,} back to back in one process (no worker): server "
        "CPU per call, the script's own time (`evalsha`/`fcall` µs, its commands included), "
        "the commands' time, the rest (Lua: the prelude, argument parsing, encoding), and "
        "the commands it runs:\n\n"
        + table(
            ("step", "server CPU µs", "script µs", "commands µs", "Lua µs", "commands run"),
            rows,
        )
    )
    return "\n".join(parts)
