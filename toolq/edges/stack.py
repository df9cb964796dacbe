"""A whole local toolq stack as child processes: what ``toolq up`` and ``toolq demo`` run.

    with Stack(StackConfig(app="toolq.examples.invoices:tq", calls_workers=2)) as stack:
        print(stack.redis_url)
        stack.kill_worker(0)      # SIGKILL a calls worker's process group, as a crash would
        stack.restart_worker(0)   # stack.restart(child) for any child

``toolq up`` watches :meth:`Stack.supervised` and restarts what exits
(``toolq.edges.cli.stack.Supervisor``, deciding with :mod:`toolq.process.supervise`).

The server is an embedded Valkey (:class:`toolq.adapters.embedded.EmbeddedServer`)
unless a URL is given. Every role is ``python -m toolq.edges.cli ROLE`` in a
process group of its own (so a signal reaches a prefork pool too), armed on
Linux with ``PR_SET_PDEATHSIG`` so nothing outlives a SIGKILLed parent.
Children are forked from one long-lived thread: the death signal fires when
the *thread* that forked a child exits. :meth:`Stack.stop` stops them in
reverse order: the API, the workers, the scheduler (SIGTERM, then SIGKILL
after a timeout), then the server.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from toolq.adapters.embedded import EmbeddedServer
from toolq.core.errors import ToolqError
from toolq.core.settings import QueueSettings, ToolqSettings
from toolq.process.procs import pdeathsig_preexec, spawner

__all__ = [
    "Child",
    "Stack",
    "StackConfig",
    "StackError",
    "deployment_id",
    "free_port",
    "node_name",
    "process_group_of",
]


class StackError(ToolqError):
    """The stack could not be started."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def accepting(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a TCP connect succeeds)."""
    if host in ("0.0.0.0", "::", ""):  # bound to every address: ask loopback
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


_stacks = itertools.count()


def deployment_id() -> str:
    """What tells this stack's workers from another's on a shared broker: the pid of the
    process that runs it (``toolq up``'s), and a count after the first stack in it."""
    n = next(_stacks)
    return str(os.getpid()) if n == 0 else f"{os.getpid()}-{n}"


def node_name(name: str, deployment: str) -> str:
    """A worker's Celery node name, ``calls-1.4242@%h``: unique per deployment, because
    RabbitMQ gives each node name one exclusive control queue (``<name>.celery.pidbox``)
    and refuses a second deployment's worker of the same name (``RESOURCE_LOCKED``)."""
    return f"{name}.{deployment}@%h"


def process_group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _appendfsync_for(settings: ToolqSettings) -> str:
    return "everysec" if settings.durability == "none" else "always"


@dataclass
class StackConfig:
    app: str
    #: None: start an embedded Valkey.
    redis_url: str | None = None
    #: The embedded server's data directory; None is a temporary one, removed on stop.
    data_dir: Path | None = None
    appendonly: bool = True
    #: ``always`` unless TOOLQ_DURABILITY=none: what ``durability="fsync"`` needs
    #: (a power loss then undoes nothing a client was told; bench/RESULTS.md "Durability").
    appendfsync: str = field(default_factory=lambda: _appendfsync_for(ToolqSettings()))
    calls_workers: int = 1
    verify_workers: int = 1
    concurrency: int = 4
    pool: str = "threads"
    loglevel: str = "WARNING"
    #: Workers send Celery task events (for Flower); off by default, as in Celery.
    events: bool = False
    #: The scheduler serves metrics here (one endpoint for the stack).
    metrics_port: int | None = None
    api_port: int | None = None
    api_host: str = "127.0.0.1"
    #: Extra environment for every child (TOOLQ_* settings, tool configuration).
    env: dict[str, str] = field(default_factory=dict)
    #: Where children's output goes: a file per child here, else inherited.
    log_dir: Path | None = None
    queues: QueueSettings = field(default_factory=QueueSettings)
    #: In the workers' node names (:func:`node_name`).
    deployment: str = field(default_factory=deployment_id)


@dataclass
class Child:
    role: str  # scheduler | relay | calls | verify | api
    name: str  # e.g. calls-1
    argv: list[str]
    popen: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Stack:
    """Start, watch, and stop the processes of one local deployment."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.server: EmbeddedServer | None = None
        self._url = config.redis_url
        self.children: list[Child] = []
        self.started_at: float | None = None

    # ------------------------------------------------------------------ properties

    @property
    def redis_url(self) -> str:
        if self._url is None:
            raise StackError("the stack has no server before start()")
        return self._url

    @property
    def embedded(self) -> bool:
        return self.server is not None

    @property
    def workers(self) -> list[Child]:
        """Calls workers: what :meth:`kill_worker` indexes."""
        return [c for c in self.children if c.role == "calls"]

    @property
    def metrics_url(self) -> str | None:
        p = self.config.metrics_port
        return f"http://127.0.0.1:{p}/metrics" if p else None

    @property
    def api_url(self) -> str | None:
        p = self.config.api_port
        return f"http://{self.config.api_host}:{p}" if p else None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Stack:
        cfg = self.config
        try:
            if self._url is None:
                self.server = EmbeddedServer(
                    cfg.data_dir, appendonly=cfg.appendonly, appendfsync=cfg.appendfsync
                )
                self.server.start()
                self._url = str(self.server.url)
            if cfg.log_dir is not None:
                cfg.log_dir.mkdir(parents=True, exist_ok=True)
            self.children = self._plan()
            for child in self.children:
                self._spawn(child)
        except BaseException:
            self.stop()
            raise
        self.started_at = time.monotonic()
        return self

    def _plan(self) -> list[Child]:
        cfg = self.config
        common = ["--app", cfg.app, "--loglevel", cfg.loglevel]
        plan = [Child("scheduler", "scheduler", ["scheduler", *common, *self._metrics_args()])]
        if self.needs_relay:  # the broker is not the ledger: the outbox needs its relay
            plan.append(Child("relay", "relay", ["relay", *common]))
        for role, count, queue in (
            ("calls", cfg.calls_workers, cfg.queues.calls),
            ("verify", cfg.verify_workers, cfg.queues.verify),
        ):
            for i in range(1, count + 1):
                name = f"{role}-{i}"
                argv = [
                    "worker",
                    *common,
                    "--queues",
                    queue,
                    "--pool",
                    cfg.pool,
                    "--concurrency",
                    str(cfg.concurrency),
                    "--hostname",
                    node_name(name, cfg.deployment),
                    *(["--events"] if cfg.events else []),
                ]
                plan.append(Child(role, name, argv))
        if cfg.api_port:
            plan.append(
                Child(
                    "api",
                    "api",
                    [
                        "api",
                        "--app",
                        cfg.app,
                        "--host",
                        cfg.api_host,
                        "--port",
                        str(cfg.api_port),
                        "--loglevel",
                        cfg.loglevel,
                    ],
                )
            )
        return plan

    @property
    def needs_relay(self) -> bool:
        """The children publish through the outbox (a broker URL is set for them)."""
        from toolq.topology.publish import publish_for  # it loads the ledger: only when asked

        url = self.config.env.get("TOOLQ_BROKER_URL") or os.environ.get("TOOLQ_BROKER_URL")
        return publish_for(url).needs_relay

    def _metrics_args(self) -> list[str]:
        p = self.config.metrics_port
        return ["--metrics-port", str(p)] if p else []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.config.env)
        # Passed in the environment, not argv: a URL with a password stays out of `ps`.
        env["TOOLQ_REDIS_URL"] = self.redis_url
        env.pop("TOOLQ_APP", None)
        return env

    def _spawn(self, child: Child) -> None:
        cfg = self.config
        out: IO[bytes] | None = None
        if cfg.log_dir is not None:
            out = open(cfg.log_dir / f"{child.name}.log", "ab")  # noqa: SIM115 - kept open
        child.log = out
        argv = [sys.executable, "-m", "toolq.edges.cli", *child.argv]
        env = self._env()

        def launch() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                preexec_fn=pdeathsig_preexec(),
            )

        child.popen = spawner.popen(launch)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop everything this stack started, in reverse order. Safe to call twice."""
        stages = [
            [c for c in self.children if c.role == "api"],
            [c for c in self.children if c.role in ("calls", "verify")],
            [c for c in self.children if c.role in ("scheduler", "relay")],
        ]
        for stage in stages:
            _terminate(stage, timeout)
        for child in self.children:
            if child.log is not None:
                child.log.close()
                child.log = None
        if self.server is not None:
            self.server.stop(timeout=timeout)

    def kill_all(self) -> None:
        """SIGKILL every child's group and the server at once (a second Ctrl-C)."""
        for child in self.children:
            _killpg(child, signal.SIGKILL)
        if self.server is not None:
            self.server.kill()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ watching

    def wait_serving(self, timeout: float = 30.0) -> list[str]:
        """Wait until the stack's HTTP endpoints (the scheduler's metrics, the API) take
        connections, so that the addresses ``toolq up`` prints answer when it prints
        them: its children start in parallel and bind their ports a second or two
        later. Returns the endpoints still not serving after ``timeout`` (none: all
        serve); stops early when a child exited (its supervisor says so)."""
        cfg = self.config
        endpoints = (
            ("metrics", "127.0.0.1", cfg.metrics_port),
            ("api", cfg.api_host, cfg.api_port),
        )
        ports = {name: (host, port) for name, host, port in endpoints if port}
        waiting = list(ports)
        deadline = time.monotonic() + timeout
        while waiting and not self.exited() and time.monotonic() < deadline:
            waiting = [name for name in waiting if not accepting(*ports[name])]
            if waiting:
                time.sleep(0.1)
        return waiting

    def exited(self) -> list[Child]:
        """Children that are no longer running (a healthy stack has none)."""
        return [c for c in self.children if c.popen is not None and not c.running]

    def pids(self) -> dict[str, int]:
        out = {c.name: c.pid for c in self.children if c.pid is not None and c.running}
        if self.server is not None and self.server.running:
            out["valkey"] = self.server.pid
        return out

    def worker_of(self, pid: int) -> int | None:
        """The index (in :attr:`workers`) of the calls worker whose group holds ``pid``."""
        group = process_group_of(pid)
        for i, child in enumerate(self.workers):
            if child.pid is not None and (child.pid == pid or child.pid == group):
                return i
        return None

    # ------------------------------------------------------------------ chaos helpers

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Signal calls worker ``index``'s whole process group; returns its pid."""
        child = self.workers[index]
        if child.popen is None:
            raise StackError(f"{child.name} was never started")
        pid = child.popen.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=10)
        return pid

    def restart_worker(self, index: int, timeout: float = 10.0) -> int:
        """Stop calls worker ``index`` if it still runs, start a new one; returns its pid."""
        return self.restart(self.workers[index], timeout)

    def supervised(self) -> list[Child]:
        """What a supervisor watches: the embedded server (as ``valkey``, when this stack
        started one), then the children."""
        if self.server is None:
            return list(self.children)
        return [Child("server", "valkey", [], self.server.process), *self.children]

    def reap(self, child: Child, timeout: float = 10.0) -> None:
        """Stop what is left of ``child``'s process group (a prefork pool's processes
        outlive their killed leader), without starting it again."""
        _terminate([child], timeout)

    def restart(self, child: Child, timeout: float = 10.0) -> int:
        """Stop ``child`` if it still runs (and what is left of its process group: a
        prefork pool's processes), start it again with the same argv; returns its pid.
        The embedded server starts again on its port and data (append-only file)."""
        if child.role == "server" and self.server is not None:
            self.server.start(timeout=timeout)
            child.popen = self.server.process
            return self.server.pid
        _terminate([child], timeout)
        if child.log is not None:
            child.log.close()
        self._spawn(child)
        assert child.popen is not None
        return child.popen.pid


def _terminate(children: Sequence[Child], timeout: float) -> None:
    """SIGTERM each child's group, wait for all, SIGKILL the groups that remain."""
    live = [c for c in children if c.popen is not None]
    for c in live:
        if c.running:
            _killpg(c, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for c in live:
        assert c.popen is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    for c in live:
        assert c.popen is not None
        # Even after a clean exit: a pool child must not outlive its leader.
        _killpg(c, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.popen.wait(timeout=5)


def _killpg(child: Child, sig: int) -> None:
    if child.popen is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.popen.pid, sig)
