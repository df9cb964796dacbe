"""Child processes for the benchmarks: workers, schedulers, proxies.

Every child runs in a session (and process group) of its own and dies with the
bench process (``PR_SET_PDEATHSIG`` on Linux), so a prefork worker's pool
children never outlive a run. Output goes to a log file, never to a pipe
nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from toolq.process.procs import descendants, pdeathsig_preexec

REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/toolq-bench-logs"))


def child_env(extra: Mapping[str, str] | None = None, root: Path = REPO_ROOT) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(root), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.pop("TOOLQ_REDIS_URL", None)
    env.update(extra or {})
    return env


class Child:
    """A child process in its own group, with its output in ``LOG_DIR/<name>.log``.

    ``root``: the source tree it imports toolq and bench from (another commit's
    checkout, for a before/after comparison); default this one."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        root: Path = REPO_ROOT,
    ) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.argv = list(argv)
        self.log_path = LOG_DIR / f"{name}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=child_env(env, root),
                cwd=str(root),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=pdeathsig_preexec(),
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group, as a crash would, and reap the leader."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.kill()

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def descendants(self) -> list[int]:
        """Live descendants of the leader (a prefork worker's pool children)."""
        return descendants(self.proc.pid)


def python_child(
    name: str, args: Sequence[str], env: Mapping[str, str] | None = None, root: Path = REPO_ROOT
) -> Child:
    return Child(name, [sys.executable, *args], env, root)


#: The pools ``toolq worker --pool`` takes.
CLI_POOLS = ("prefork", "threads", "solo", "asyncio")


def events_on() -> bool:
    """``BENCH_EVENTS=1``: both sides' workers send Celery task events."""
    return os.environ.get("BENCH_EVENTS", "") not in ("", "0")


def _pool_args(pool: str, concurrency: int, queues: str, loglevel: str) -> list[str]:
    """The worker options both sides are started with, spelled once."""
    return ["--pool", pool, "--concurrency", str(concurrency), "-Q", queues, "--loglevel", loglevel]


def toolq_worker(
    name: str,
    app: str,
    url: str,
    *,
    pool: str,
    concurrency: int,
    queues: str,
    env: Mapping[str, str] | None = None,
    loglevel: str = "WARNING",
    hostname: str | None = None,
    root: Path = REPO_ROOT,
) -> Child:
    argv = ["-m", "toolq.edges.cli", "worker", "--app", app, "--redis-url", url]
    if pool not in CLI_POOLS:
        # `toolq worker` offers prefork, threads, solo and asyncio; Celery itself runs the rest
        # (gevent) on the same app, the server named in the environment.
        module = app.split(":")[0]
        argv = ["-m", "celery", "-A", f"{module}:celery_app", "worker", "--without-mingle"]
        env = {**(env or {}), "TOOLQ_REDIS_URL": url}
    argv += _pool_args(pool, concurrency, queues, loglevel)
    if events_on():
        argv.append("--events" if pool in CLI_POOLS else "-E")
    if hostname:
        argv += ["--hostname", hostname]
    return python_child(name, argv, env, root)


def toolq_scheduler(
    name: str,
    app: str,
    url: str,
    env: Mapping[str, str] | None = None,
    loglevel: str = "WARNING",
    root: Path = REPO_ROOT,
) -> Child:
    return python_child(
        name,
        [
            "-m",
            "toolq.edges.cli",
            "scheduler",
            "--app",
            app,
            "--redis-url",
            url,
            "--loglevel",
            loglevel,
        ],
        env,
        root,
    )


def bare_worker(
    name: str,
    url: str,
    *,
    pool: str,
    concurrency: int,
    queues: str,
    env: Mapping[str, str] | None = None,
) -> Child:
    argv = ["-m", "celery", "-A", "bench.bare_app:app", "worker"]
    argv += _pool_args(pool, concurrency, queues, "WARNING")
    argv += ["--without-mingle", "--without-gossip"]
    return python_child(name, argv, {"BENCH_REDIS_URL": url, **(env or {})})


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample_rss(
    pid: int, stop: threading.Event, out: list[int], every: float = 0.2
) -> threading.Thread:
    """A daemon thread appending ``pid``'s RSS (kB) to ``out`` every ``every`` s until ``stop``."""

    def run() -> None:
        while not stop.is_set():
            out.append(rss_kb(pid))
            stop.wait(every)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_for(pred: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of one process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TCK


def group_cpu(child: Child) -> float:
    """CPU time of a child and its live descendants (a prefork worker and its pool)."""
    return sum(cpu_seconds(p) for p in [child.pid, *child.descendants()])
