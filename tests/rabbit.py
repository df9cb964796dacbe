"""A real RabbitMQ for the tests: Debian's ``rabbitmq-server``, started in a temporary
directory on free ports, stopped with everything it started, epmd included: each
node gets an Erlang port mapper of its own on a free port (``ERL_EPMD_PORT``),
which a node starts as a daemon that outlives it, so :meth:`RabbitServer.stop`
stops it (``epmd -kill``), never touching a port mapper the host runs.

Missing binary: the tests that need it are skipped, saying how to get it,
unless ``CI`` is set, where they fail (as the browser tests do without chromium).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server")
#: A cold node boots in ~5-10 s on this box (Erlang start, Mnesia, the schema).
START_TIMEOUT_S = 60.0


def _binary() -> str | None:
    explicit = os.environ.get("TOOLQ_RABBITMQ_SERVER")
    for candidate in (explicit,) if explicit else CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RabbitServer:
    """One RabbitMQ node of the test session (:meth:`start`, :meth:`stop`)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="toolq-rabbit-"))
        self.name = f"toolq_{uuid.uuid4().hex[:8]}@localhost"
        self.epmd_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> None:
        plugins = self.dir / "enabled_plugins"
        plugins.write_text("[].\n")  # no management plugin: half the boot time
        env = {
            **os.environ,
            "HOME": str(self.dir),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(_free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),  # none: the defaults
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            "ERL_EPMD_PORT": str(self.epmd_port),
        }
        with (self.dir / "stdout.log").open("wb") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [self.binary],
                env=env,
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with its children
            )
        self._wait()

    def _wait(self) -> None:
        from kombu import Connection

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited: {self.tail()}")
            try:
                with Connection(self.url, connect_timeout=1) as conn:
                    conn.connect()
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"rabbitmq-server did not answer in {START_TIMEOUT_S} s: {self.tail()}")

    def tail(self) -> str:
        path = self.dir / "stdout.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the node (its process group), as a crash would; :meth:`start` brings
        it back on the same port, with its data (durable queues and their messages)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._stop_epmd()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_epmd(self) -> None:
        """The node's own port mapper (a daemon, outside its process group)."""
        epmd = shutil.which("epmd") or next(
            (str(p) for p in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None
        )
        if epmd is None:
            return
        env = {**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)}
        subprocess.run(
            [epmd, "-port", str(self.epmd_port), "-kill"],
            env=env,
            capture_output=True,
            timeout=10,
            check=False,
        )


def start_rabbit() -> RabbitServer:
    """A started node, or a skip (a failure under CI) when there is no rabbitmq-server."""
    binary = _binary()
    if binary is None:
        why = (
            "no rabbitmq-server: the outbox tests need Debian's rabbitmq-server "
            "(apt-get install rabbitmq-server) or TOOLQ_RABBITMQ_SERVER=/path/to/it"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    server = RabbitServer(binary)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
