"""The embedded Valkey server as a real process, and the suite's database fixtures."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import wait_until
from toolq.adapters.embedded import EmbeddedServer, EmbeddedServerError

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only"
)


def _gone(pid: int) -> bool:
    """No such process, or a zombie (a container's init may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return _gone(pid)


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path / "data") as started:
        yield started


def test_serves_with_the_configuration_toolq_needs(server: EmbeddedServer) -> None:
    client = _client(server.url)
    try:
        config = client.config_get("*")
    finally:
        client.close()

    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"  # durability="fsync" needs it
    assert config["maxmemory-policy"] == "noeviction"
    assert config["save"] == ""
    assert config["databases"] == "16"
    assert config["bind"] == "127.0.0.1"
    assert config["protected-mode"] == "yes"


def test_data_survives_a_stop_and_a_new_server_on_the_same_dir(tmp_path: Path) -> None:
    # Given a key written to an AOF server
    with EmbeddedServer(tmp_path) as first:
        client = _client(first.url)
        client.set("ledger:op-1", b"committed")
        client.close()
    assert first.running is False

    # When a second server starts on the same directory
    with EmbeddedServer(tmp_path) as second:
        client = _client(second.url)
        try:
            # Then the key is there
            assert client.get("ledger:op-1") == b"committed"
        finally:
            client.close()
    assert tmp_path.is_dir(), "a data_dir the caller gave is never removed"


def test_restart_keeps_port_url_and_data() -> None:
    with EmbeddedServer() as server:
        url, old_pid = server.url, server.pid
        client = _client(url)
        client.set("k", b"v")

        server.restart()

        assert server.url == url
        assert server.pid != old_pid
        assert _wait_gone(old_pid)
        assert client.get("k") == b"v"  # the client reconnects to the same URL
        client.close()


def test_hard_restart_keeps_what_was_fsynced(tmp_path: Path) -> None:
    # appendfsync always: every write is on disk before the reply, so a
    # SIGKILL loses nothing (with everysec it could lose up to a second).
    with EmbeddedServer(tmp_path, extra_config={"appendfsync": "always"}) as server:
        client = _client(server.url)
        client.set("k", b"v")

        server.restart(hard=True)

        assert client.get("k") == b"v"
        client.close()


def test_a_killed_server_can_be_started_again() -> None:
    server = EmbeddedServer(appendonly=False)
    server.start()
    try:
        pid = server.pid
        server.kill()
        assert not server.running
        assert _wait_gone(pid)

        server.start()
        client = _client(server.url)
        assert client.ping()
        client.close()
    finally:
        server.stop()


def test_a_temporary_data_dir_is_removed_on_stop_unless_persisted() -> None:
    transient = EmbeddedServer(appendonly=False)
    transient.start()
    transient_dir = transient.data_dir
    transient.stop()
    assert not transient_dir.exists()

    kept = EmbeddedServer(appendonly=False, persist=True)
    kept.start()
    kept_dir = kept.data_dir
    kept.stop()
    try:
        assert (kept_dir / "valkey.conf").is_file()
    finally:
        for path in sorted(kept_dir.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        kept_dir.rmdir()


KILLED = "ignored SIGTERM; killing it"


def test_stop_escalates_to_sigkill_when_sigterm_is_not_enough(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a server that must save before it exits on SIGTERM, and cannot: its
    # snapshot's name is taken by a directory, so it refuses to shut down and runs on.
    # (A server stuck in DEBUG SLEEP is no such case: valkey 8 shuts down from it at once.)
    with EmbeddedServer(tmp_path, appendonly=False, extra_config={"save": "3600 1"}) as server:
        pid, log = server.pid, server.log_path
        (server.data_dir / "dump.rdb").mkdir()

        # When stop() is given a grace period (enough for the refusal to be logged)
        with caplog.at_level(logging.WARNING, logger="toolq.embedded"):
            server.stop(timeout=2.0)

    # Then it killed the server instead of waiting on it
    killed = [r.getMessage() for r in caplog.records if KILLED in r.getMessage()]
    assert killed == [f"embedded valkey pid={pid} {KILLED}"]
    assert _gone(pid)
    assert "can't exit" in log.read_text()  # it did refuse SIGTERM


def test_stop_shuts_down_a_frozen_server_gracefully(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedServer(tmp_path, appendonly=False)
    server.start()
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)  # a chaos test froze it

    with caplog.at_level(logging.WARNING, logger="toolq.embedded"):
        server.stop(timeout=30)

    # SIGCONT let SIGTERM act: no SIGKILL was needed
    assert not [r for r in caplog.records if KILLED in r.getMessage()]
    assert _gone(pid)


def test_a_password_is_required_and_never_printed(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path, appendonly=False, password="pw:with/odd@chars") as server:
        assert "pw:with" not in repr(server)
        authed = _client(server.url)
        anonymous = _client(f"redis://127.0.0.1:{server.port}/0")
        try:
            assert authed.ping()
            with pytest.raises(redis.AuthenticationError):
                anonymous.ping()
        finally:
            authed.close()
            anonymous.close()


def test_a_port_in_use_fails_loudly_with_the_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = EmbeddedServer(tmp_path, port=port, appendonly=False)

        with pytest.raises(EmbeddedServerError, match=r"(?s)exited.*Address already in use"):
            server.start()
    assert not server.running
    server.stop()


@linux_only
def test_a_server_started_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    # PR_SET_PDEATHSIG follows the forking *thread*; the spawner thread must own it.
    server = EmbeddedServer(tmp_path, appendonly=False)
    thread = threading.Thread(target=server.start)
    thread.start()
    thread.join()
    try:
        # join() returns before the OS thread is gone; its exit is what would send the
        # death signal, were it armed on that thread (a SIGKILL: nothing answers after it)
        task = Path(f"/proc/self/task/{thread.native_id}")
        assert wait_until(lambda: not task.exists(), 10)
        assert server.running
        client = _client(server.url)
        assert client.ping()
        client.close()
    finally:
        server.stop()


_CHILD = """
import sys, time
from pathlib import Path
from toolq.adapters.embedded import EmbeddedServer
server = EmbeddedServer(Path(sys.argv[1]), appendonly=False)
server.start()
print(server.pid, server.data_dir, flush=True)
if sys.argv[2] == "hang":
    time.sleep(120)
"""


def _start_child(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(tmp_path), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, f"the child exited with {child.wait()} before starting a server"
    return child, int(line.split()[0])


@linux_only
def test_the_server_dies_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    # Given a Python process running an embedded server
    child, valkey_pid = _start_child(tmp_path, "hang")
    with child:
        assert not _gone(valkey_pid)

        # When that process is SIGKILLed (no atexit, no finally)
        child.kill()
        child.wait()

    # Then the server goes too
    assert _wait_gone(valkey_pid), f"valkey pid {valkey_pid} outlived its parent"


def test_atexit_stops_a_server_nobody_stopped(tmp_path: Path) -> None:
    child, valkey_pid = _start_child(tmp_path, "return")
    with child:
        assert child.wait(timeout=30) == 0

    assert _wait_gone(valkey_pid)


# --------------------------------------------------------------------------- suite fixtures


def test_redis_url_is_an_empty_database_of_its_own(redis_url: str, module_redis_url: str) -> None:
    per_test, per_module = _client(redis_url), _client(module_redis_url)
    try:
        assert per_test.connection_pool.connection_kwargs["db"] not in (0, None)
        assert redis_url != module_redis_url
        assert per_test.dbsize() == 0

        per_module.set("module-key", 1)
        per_test.set("test-key", 1)

        assert per_test.get("module-key") is None
        assert per_module.get("test-key") is None
    finally:
        per_test.close()
        per_module.close()


def test_module_redis_url_is_shared_within_the_module(module_redis_url: str) -> None:
    client = _client(module_redis_url)
    try:
        assert client.get("module-key") == b"1", "set by the test above, same module database"
    finally:
        client.close()


def test_the_session_server_has_room_for_every_test(valkey: str) -> None:
    if os.environ.get("TOOLQ_TEST_REDIS_URL"):
        pytest.skip("an external server's database count is its own")
    client = _client(valkey)
    try:
        assert client.config_get("databases")["databases"] == "4096"
        # as deployed: the suite runs the durable path (claims confirmed on disk)
        aof = client.config_get("append*")
        assert (aof["appendonly"], aof["appendfsync"]) == ("yes", "always")
    finally:
        client.close()
