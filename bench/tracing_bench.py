"""``python -m bench tracing``: what OpenTelemetry costs a call (issue 30).

Two measurements:

- **hooks**, in one process, no I/O: the tracing calls one call passes through (the
  client's submit span and its stored context, the worker's attempt span, its state
  events and the record, a log record's ids), per call, with the package absent, the
  API without a tracer provider (tracing off, the default), and the SDK with a batch
  processor and an exporter that drops everything (tracing on). Median of rounds.
- **end to end**: no-op writes in a closed loop through a real worker (threads), the
  client and the worker both run from the code under test, in rounds A B C A B C:
  ``main`` (the code before tracing, ``--main-tree``), ``off`` and ``on`` (the SDK as
  above in the client, the worker and nowhere else). Calls per second and CPU per
  call (client + worker processes), medians.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import procs
from bench.common import fmt, median
from bench.report import table

ARMS = ("main", "off", "on")
TRACING_ENV = "BENCH_TRACING"
HERE = Path(__file__).resolve().parent.parent


def install_sdk() -> None:
    """The SDK with a batch processor and an exporter that drops every span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


# --------------------------------------------------------------------------- hooks


def _hooks_once(i: int, t: Any, record: logging.LogRecord) -> None:
    from toolq.core.states import State
    from toolq.process import logs, tracing

    with tracing.submitting("noop") as span:
        stored = span.carrier()
        span.submitted("op/1", State.QUEUED, True, 0)
    with tracing.attempt("noop", "op/1", 1, stored, ""):
        tracing.current().recorded(t, "ok", 0)
        record.__dict__.pop("operation_ref", None)
        record.__dict__.pop("trace_id", None)
        logs.add_context(record)


def hooks(rounds: int, calls: int) -> dict[str, float]:
    """µs per call of the tracing hooks, per arm: the median of ``rounds`` and, as
    ``<arm>_best``, the fastest (the one least disturbed by the machine's other load)."""
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    from toolq.core.states import State
    from toolq.decisions.recovery.transition import Transition
    from toolq.process import tracing

    def _reset() -> None:  # one provider per process: the API's own tests reset it so
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None

    out: dict[str, float] = {}
    api = tracing.otel
    for arm in ("absent", "off", "on"):
        _reset()
        if arm == "on":
            install_sdk()
        tracing.otel = None if arm == "absent" else api
        per: list[float] = []
        t = Transition(ref="op/1", states=(State.RUNNING,), to=State.SUCCEEDED, by="w")
        record = logging.LogRecord("toolq.worker", 20, "", 0, "m", None, None)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for i in range(calls):
                _hooks_once(i, t, record)
            per.append((time.perf_counter() - t0) / calls * 1e6)
        out[arm] = median(per)
        out[arm + "_best"] = min(per)
    tracing.otel = api
    _reset()
    return out


# --------------------------------------------------------------------------- end to end

CLIENT = """
import json, os, sys, time
if os.environ.get("BENCH_TRACING"):
    from bench.tracing_bench import install_sdk
    install_sdk()
from bench import apps
from bench.load import closed_loop
apps.tq.configure(redis_url=sys.argv[1])
calls, concurrency = int(sys.argv[2]), int(sys.argv[3])
def call(i):
    env = apps.tq.wait(apps.tq.submit("noop", {"n": i}).operation_ref, timeout=120)
    assert env.ok, env
for i in range(200):
    call(i)
c0 = time.process_time()
res = closed_loop(call, calls, concurrency)
print(json.dumps({"rate": res.calls / res.seconds, "cpu_s": time.process_time() - c0,
                  "errors": res.errors, "toolq": __import__("toolq").__file__}))
"""


def _env(arm: str, main_tree: str) -> dict[str, str]:
    tree = main_tree if arm == "main" else str(HERE)
    # the arm's toolq first; bench (the apps, the loop) from this tree
    env = {"PYTHONPATH": os.pathsep.join([tree, str(HERE)])}
    if arm == "on":
        env[TRACING_ENV] = "1"
    return env


def one_round(url: str, arm: str, calls: int, concurrency: int, main_tree: str) -> dict[str, Any]:
    env = _env(arm, main_tree)
    # -P: not the working directory first on sys.path, the arm's tree (PYTHONPATH)
    argv = [sys.executable, "-P", "-m", "toolq.edges.cli", "worker", "--app", "bench.apps:tq"]
    argv += ["--redis-url", url, "--pool", "threads", "--concurrency", "8"]
    argv += ["-Q", "toolq.calls", "--loglevel", "WARNING"]
    worker = procs.Child(f"tracing-{arm}", argv, env)
    try:
        run_env = {**os.environ, **env}
        w0 = procs.group_cpu(worker)
        out = subprocess.run(
            [sys.executable, "-P", "-c", CLIENT, url, str(calls), str(concurrency)],
            env=run_env, cwd=str(HERE), capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise SystemExit(f"client failed ({arm}): {out.stderr[-2000:]}\n{worker.tail()}")
        res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        res["worker_cpu_s"] = procs.group_cpu(worker) - w0
        res["cpu_ms_per_call"] = (res["cpu_s"] + res["worker_cpu_s"]) / calls * 1000
        return res
    finally:
        worker.stop()


def run(url: str, calls: int, rounds: int, concurrency: int, main_tree: str) -> dict[str, Any]:
    res: dict[str, Any] = {"calls": calls, "rounds": rounds, "hooks_us": hooks(7, 5_000)}
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            runs[arm].append(one_round(url, arm, calls, concurrency, main_tree))
    res["runs"] = runs
    return res


def render(res: dict[str, Any]) -> str:
    h = res["hooks_us"]
    runs = res["runs"]
    rate = {arm: median([r["rate"] for r in runs[arm]]) for arm in ARMS}
    cpu = {arm: median([r["cpu_ms_per_call"] for r in runs[arm]]) for arm in ARMS}
    rows = [
        (
            arm,
            fmt(rate[arm]),
            ", ".join(fmt(r["rate"]) for r in runs[arm]),
            fmt(rate[arm] / rate["main"], 2),
            fmt(cpu[arm], 2),
        )
        for arm in ARMS
    ]
    return (
        "## Tracing (issue 30): what OpenTelemetry costs a call\n\n"
        "`python -m bench tracing`. Hooks alone, in one process, 7 rounds of 5,000, "
        "median (fastest round): "
        f"package absent **{fmt(h['absent'], 2)} µs** ({fmt(h['absent_best'], 2)}) per call, "
        f"API without a provider (off, the default) **{fmt(h['off'], 2)} µs** "
        f"({fmt(h['off_best'], 2)}), SDK with a batch processor and a dropping exporter "
        f"(on) **{fmt(h['on'], 1)} µs** ({fmt(h['on_best'], 1)}): the submit span and its "
        "stored context, the attempt span, 3 events, a log record's ids.\n\n"
        f"End to end: no-op writes, closed loop of 16, worker threads -c 8, "
        f"{res['calls']:,} calls x {res['rounds']} rounds, A B C alternating; `main` is "
        "the code before tracing (client and worker); `on` traces in the client and the "
        "worker.\n\n" + table(("arm", "calls/s (median)", "rounds", "vs main", "CPU ms/call"), rows)
    )
