"""Process helpers shared by the integration and end-to-end tiers.

Every process started here runs in a session (and process group) of its own,
dies with the test process on Linux (``PR_SET_PDEATHSIG``), and is stopped by
signalling its whole group, so a prefork worker's pool children go too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolq.process.procs import descendants as procs_descendants
from toolq.process.procs import pdeathsig_preexec

REPO_ROOT = Path(__file__).resolve().parent.parent


def toolq_env(env: Mapping[str, str] | None = None, *, unset: Iterable[str] = ()) -> dict[str, str]:
    """The environment for a toolq child: ours, the repo on PYTHONPATH, then ``env``.

    ``TOOLQ_REDIS_URL`` and the names in ``unset`` are removed (unless ``env`` sets them).
    """
    merged = dict(os.environ)
    paths = [str(REPO_ROOT)] + [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p]
    merged["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    for name in ("TOOLQ_REDIS_URL", *unset):
        merged.pop(name, None)  # the URL is always passed explicitly
    merged.update(env or {})
    return merged


def run_bench(
    tmp_path: Path, *argv: str, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV`` from the repo root, a bench's output (``BENCH_OUT``) and its
    processes' logs (``BENCH_LOG_DIR``) in ``tmp_path``, ``env`` besides; its output
    captured."""
    paths = {"BENCH_OUT": str(tmp_path), "BENCH_LOG_DIR": str(tmp_path / "logs")}
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=REPO_ROOT,
        env=toolq_env({**paths, **(env or {})}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_toolq(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
    cwd: str | Path | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m toolq.edges.cli ARGS`` in a process group of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "toolq.edges.cli", *args],
        env=toolq_env(env, unset=unset),
        cwd=str(cwd) if cwd is not None else str(REPO_ROOT),
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
        stdout=stdout,
        stderr=stderr,
    )


def start_worker(
    app: str,
    redis_url: str,
    *,
    queues: Iterable[str] | str | None = None,
    pool: str = "threads",
    concurrency: int = 4,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """A ``toolq worker`` for ``app`` (``MODULE:ATTR``) on ``redis_url``."""
    args = [
        "worker",
        "--app",
        app,
        "--redis-url",
        redis_url,
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "WARNING",
    ]
    if queues is not None:
        args += ["--queues", queues if isinstance(queues, str) else ",".join(queues)]
    return start_toolq([*args, *extra_args], env=env)


def start_scheduler(
    app: str,
    redis_url: str,
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """A ``toolq scheduler`` for ``app`` on ``redis_url``."""
    args = ["scheduler", "--app", app, "--redis-url", redis_url, "--loglevel", "WARNING"]
    return start_toolq([*args, *extra_args], env=env)


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)  # start_new_session: the group id is the pid


def kill_group(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole process group, as a crash would, and reap the leader."""
    _signal_group(p, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)


def stop_process(
    p: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10
) -> int | None:
    """Send ``sig`` to the group, wait up to ``timeout``, then SIGKILL the group.

    Returns the leader's exit code (negative for a signal). The group is
    SIGKILLed at the end either way, so no pool child outlives its leader.
    """
    if p.poll() is None:
        _signal_group(p, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=timeout)
    kill_group(p)
    return p.returncode


def stop_processes(
    procs: Iterable[subprocess.Popen[bytes]], sig: int = signal.SIGTERM, timeout: float = 10
) -> list[int | None]:
    """:func:`stop_process` for each of ``procs``, all at once: ``sig`` goes to every
    group first, then each gets up to ``timeout`` (counted from then) to exit before its
    group is SIGKILLed. A Celery worker takes up to a second to act on SIGTERM (its
    event loop's poll); stopped together, a worker, a relay and a scheduler take that
    second once, not each. Returns the leaders' exit codes, in order."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            _signal_group(p, sig)
    deadline = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        kill_group(p)
    return [p.returncode for p in procs]


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until truthy; True if it became truthy within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def run_aio(tq: Any, body: Callable[[], Awaitable[Any]]) -> Any:
    """``body()`` on a new event loop (``asyncio.run``), closing ``tq.aio`` on it after."""

    async def main() -> Any:
        try:
            return await body()
        finally:
            await tq.aio.aclose()

    return asyncio.run(main())


async def until_async(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    """Let the running loop go on until ``predicate`` holds; TimeoutError past ``timeout``."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def free_port() -> int:
    """A loopback TCP port nothing listens on right now, for a child process to bind."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pid_gone(pid: int) -> bool:
    """No such process, or a zombie (a container's init may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux /proc), not ``pid`` itself."""
    return set(procs_descendants(pid))


@contextlib.contextmanager
def serving(tq: Any, app: str, redis_url: str) -> Iterator[Any]:
    """``tq`` pointed at ``redis_url``, with a worker and a scheduler for ``app`` running."""
    tq.configure(redis_url=redis_url)
    procs = [start_worker(app, redis_url), start_scheduler(app, redis_url)]
    try:
        yield tq
    finally:
        stop_processes(procs, timeout=5)
        tq.close()


def fail_every_check(tq: Any, ref: str, checks: int) -> None:
    """Run a verifying write's ``checks`` verification checks in this process (an
    in-process ``tq``, fakeredis or not), each recorded as failed (``vfail`` counts up)."""
    for failed in range(1, checks + 1):
        vcheck = int(tq.ledger.fields(ref, "vcheck")["vcheck"])
        tq.runtime.run_check(ref, 1, vcheck)
        assert tq.ledger.fields(ref, "vfail")["vfail"] == str(failed)
