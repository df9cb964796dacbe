"""arq 0.28 at its defaults: two ``arq`` worker processes (max_jobs 10 each, async).

arq 0.28 pins ``redis < 6`` and toolq needs 8, so arq runs from a venv of its own
(``make .venv-arq``, or ``BENCH_ARQ_PYTHON``): its workers and a submitter process
(:mod:`bench.peers.arq_app`) that this adapter drives over a pipe. The submitter's
CPU is counted as the submitter's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from bench import procs

VENV_PYTHON = procs.REPO_ROOT / ".venv-arq" / "bin" / "python"


def arq_python() -> str | None:
    path = Path(os.environ.get("BENCH_ARQ_PYTHON", str(VENV_PYTHON)))
    return str(path) if path.exists() else None


class Adapter:
    name = "arq"
    concurrency = "20 (2 worker processes x max_jobs 10, async)"

    def __init__(self, url: str) -> None:
        python = arq_python()
        if python is None:
            raise RuntimeError("arq needs its own venv: make .venv-arq (or BENCH_ARQ_PYTHON)")
        self.python = python
        self.client = subprocess.Popen(
            [python, "-m", "bench.peers.arq_app"],
            env=procs.child_env({"BENCH_PEER_URL": url}),
            cwd=str(procs.REPO_ROOT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=procs.pdeathsig_preexec(),
        )
        self.client_pids = (self.client.pid,)

    def _ask(self, line: str) -> str:
        assert self.client.stdin is not None and self.client.stdout is not None
        self.client.stdin.write(line + "\n")
        self.client.stdin.flush()
        reply = self.client.stdout.readline().strip()
        if not reply:
            raise RuntimeError("arq submitter exited")
        return reply

    def start(self, url: str, tag: str) -> list[procs.Child]:
        argv = [self.python, "-m", "arq", "bench.peers.arq_app.WorkerSettings"]
        env = {"BENCH_PEER_URL": url}
        return [procs.Child(f"peers-{tag}arq-{i}", argv, env) for i in range(2)]

    def submit(self, task: str, ids: range) -> Any:
        self._ask(f"submit {task} {ids.start} {ids.stop}")
        return None

    def wait(self, handles: Any, timeout: float) -> int:
        return int(self._ask(f"wait {timeout}").split()[1])

    # The asyncio-pool bench's (bench.aio_pool_bench): one worker process at max_jobs.
    def aio_worker(self, url: str, max_jobs: int, name: str) -> procs.Child:
        argv = [self.python, "-m", "arq", "bench.peers.arq_app.AioSettings"]
        return procs.Child(name, argv, {"BENCH_PEER_URL": url, "BENCH_AIO_MAX_JOBS": str(max_jobs)})

    def aio_submit(self, calls: int, seconds: float, url_http: str = "") -> None:
        """``calls`` jobs awaiting ``seconds``: a sleep, or a GET to ``url_http``."""
        self._ask(f"aio {calls} {seconds} {url_http}".rstrip())

    def aio_stamps(self, timeout: float) -> dict[str, Any]:
        """The jobs' ``starts`` and ``finishes`` (epoch ms) and how many ``succeeded``."""
        stamps: dict[str, Any] = json.loads(self._ask(f"stamps {timeout}"))
        return stamps

    def close(self) -> None:
        if self.client.stdin is not None:
            self.client.stdin.close()
        try:
            self.client.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.client.kill()
