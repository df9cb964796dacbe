"""Issue 25: how soon ``toolq up`` has a SIGKILLed child serving again.

    python -m bench.up_restart [--rounds 3] [--json]

One ``toolq up`` (embedded Valkey, the example app, API and metrics on free ports) in a
temporary directory. Each round SIGKILLs, one at a time, the calls worker, the
scheduler and the API, and times from the kill to:

- **pid**: a new pid of that child recorded as running in ``.toolq/state.json``;
- **serving**: the child doing its job again: the API answers ``/v1/health`` 200; the
  scheduler's metrics endpoint answers (it serves them); a call submitted right after
  the worker's kill has completed (the only calls worker was dead meanwhile).

The issue's target: back within ~2 s. Round 1 is a child's first exit (restarted after
0.5 s); later rounds come within 60 s of the last kill of the same child, so ``toolq up``
waits 1 s, then 2 s before restarting it (:mod:`toolq.process.supervise`): their figures show
that backoff. Round 1 and the medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from toolq.adapters.stack_state import read_state

CHILDREN = ("calls-1", "scheduler", "api")


def _state(cwd: Path) -> dict[str, Any]:
    return read_state(cwd / ".toolq") or {}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _until(check: Any, timeout: float = 60.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError("not back within 60 s")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLQ_")}


def one_round(cwd: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in CHILDREN:
        state = _state(cwd)
        old = int(state["children"][name]["pid"])
        restarts = int(state["children"][name].get("restarts", 0))
        call: subprocess.Popen[bytes] | None = None
        killed = time.monotonic()
        os.killpg(old, signal.SIGKILL)
        if name == "calls-1":
            args = json.dumps({"customer": "bench", "amount": 100})
            argv = ["submit", "create_invoice", "--args", args, "--wait", "60"]
            call = subprocess.Popen(
                [sys.executable, "-m", "toolq.edges.cli", *argv],
                cwd=cwd,
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        def new_pid() -> bool:
            c = _state(cwd).get("children", {}).get(name, {})  # noqa: B023
            return c.get("state") == "running" and c.get("restarts") == restarts + 1  # noqa: B023

        pid_at = _until(new_pid)
        if name == "api":
            served_at = _until(lambda: _answers(f"{_state(cwd)['api_url']}/v1/health"))
        elif name == "scheduler":
            served_at = _until(lambda: _answers(str(_state(cwd)["metrics_url"])))
        else:
            assert call is not None
            served_at = time.monotonic() if call.wait(timeout=60) == 0 else -1.0
            if served_at < 0:
                raise RuntimeError(f"the call after the worker's kill failed: {call.returncode}")
        out[name] = {"pid_s": pid_at - killed, "serving_s": served_at - killed}
        time.sleep(2.0)  # the next kill is not a crash loop of the stack
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the rounds as JSON too")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="toolq-up-bench-") as tmp:
        cwd = Path(tmp)
        log = (cwd / "up.log").open("ab")
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "toolq.edges.cli",
                "up",
                "--metrics-port",
                "0",
                "--api-port",
                "0",
            ],
            cwd=cwd,
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _until(lambda: bool(_state(cwd).get("children")) and up.poll() is None)
            _until(lambda: _answers(f"{_state(cwd)['api_url']}/v1/health"))
            rounds = []
            for i in range(opts.rounds):
                rounds.append(one_round(cwd))
                print(f"round {i + 1}: {json.dumps(rounds[-1])}", file=sys.stderr)
        finally:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
            log.close()
    first = rounds[0]
    print(
        f"{'child':<10} {'new pid, first exit (s)':>24} {'serving (s)':>12}"
        f"   median of {opts.rounds}: pid, serving"
    )
    for name in CHILDREN:
        pid = statistics.median(r[name]["pid_s"] for r in rounds)
        served = statistics.median(r[name]["serving_s"] for r in rounds)
        print(
            f"{name:<10} {first[name]['pid_s']:>24.2f} {first[name]['serving_s']:>12.2f}"
            f"   {pid:.2f}, {served:.2f}"
        )
    if opts.json:
        print(json.dumps(rounds, indent=2))


if __name__ == "__main__":
    main()
