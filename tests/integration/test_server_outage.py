"""The ledger's server away (issue 25), on a Valkey of this module's own (the session's
is shared): no long-running process exits because of it, each says so once, and
each resumes once the server answers again on the same port.

1. A worker and a scheduler outlive the server killed for longer than Celery's
   default reconnect backoff grows over (2, 4, 6 ... s a try, one ERROR line a try,
   and an end after 100 tries): the worker logs one line when the wait starts and
   one when it ends, and runs a call submitted once the server is back.
2. A worker, a scheduler, a relay, the API and the MCP server started while the
   server is down do not exit (they used to, in under a second: "cannot reach
   Redis"): each waits or serves 503, says so once, and the deployment runs a call
   once the server is up.
3. The API's event streams open when the server goes away end cleanly (their
   clients resume from Last-Event-ID), the outage said once, not a traceback each.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import free_port, start_toolq, stop_processes, wait_until
from tests.integration.apps import outbox_app, runtime_app
from toolq import ToolQueue
from toolq.adapters.embedded import EmbeddedServer, url_for_db

#: Long enough for Celery's old backoff to grow past 6 s a try (2+4+6+8 s).
DOWN_S = 22.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path / "valkey", port=free_port(), appendonly=True)
    yield s
    s.stop()


def _log(tmp_path: Path, name: str) -> tuple[Path, int]:
    """A log file for a child's stderr (the child keeps its own copy of the fd)."""
    path = tmp_path / f"{name}.log"
    with path.open("wb") as f:
        return path, os.dup(f.fileno())


def _said(path: Path) -> str:
    return path.read_text(errors="replace")


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_a_worker_outlives_the_server_down_and_says_it_once(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    server.start()
    url = url_for_db(server.url, 0)
    app = "tests.integration.apps.runtime_app:tq"
    worker_log, worker_fd = _log(tmp_path, "worker")
    worker = start_toolq(
        ["worker", "--app", app, "--pool", "threads", "-c", "2", "--loglevel", "INFO"],
        env={"TOOLQ_REDIS_URL": url},
        stderr=worker_fd,
    )
    os.close(worker_fd)
    scheduler = start_toolq(
        ["scheduler", "--app", app, "--loglevel", "WARNING"], env={"TOOLQ_REDIS_URL": url}
    )
    tq: ToolQueue = runtime_app.tq
    tq.configure(redis_url=url)
    try:
        # Given a worker that serves calls
        assert tq.wait(tq.submit("pay", {}, operation_ref="down/warm").operation_ref, 60).ok

        # When the server is killed for longer than the old backoff grows over
        server.kill()
        assert wait_until(lambda: "unavailable (" in _said(worker_log), timeout=30)
        time.sleep(DOWN_S)  # keep it down
        assert worker.poll() is None and scheduler.poll() is None
        server.start()
        back = time.monotonic()

        # Then a call submitted once it answers runs, and the worker said it once
        ref = tq.submit("pay", {}, operation_ref="down/after").operation_ref
        assert tq.wait(ref, timeout=60).ok
        print(f"first call done {time.monotonic() - back:.2f} s after the server answered")
        assert worker.poll() is None and scheduler.poll() is None
    finally:
        tq.close()
        stop_processes((worker, scheduler), timeout=5)
    said = _said(worker_log)
    assert said.count("the broker (the ledger's server) unavailable") == 1, said[-3000:]
    assert said.count("the broker (the ledger's server) back after") == 1, said[-3000:]
    assert "Trying again in" not in said, said[-3000:]  # Celery's line a try


def test_every_process_started_while_the_server_is_down_waits_for_it(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    # Given a server that is not up yet (its port known), in outbox mode: the broker
    # is another database of the same server
    url, broker = url_for_db(server.url, 0), url_for_db(server.url, 1)
    env = {"TOOLQ_REDIS_URL": url, "TOOLQ_BROKER_URL": broker}
    app = outbox_app.APP
    api_port, mcp_port = free_port(), free_port()
    roles = {
        "worker": ["worker", "--app", app, "--pool", "threads", "-c", "2"],
        "scheduler": ["scheduler", "--app", app],
        "relay": ["relay", "--app", app],
        "api": ["api", "--app", app, "--port", str(api_port)],
        "mcp": ["mcp", "--app", app, "--transport", "http", "--port", str(mcp_port)],
    }
    logs: dict[str, Path] = {}
    procs = {}
    for role, argv in roles.items():
        logs[role], fd = _log(tmp_path, role)
        procs[role] = start_toolq(argv, env=env, stderr=fd)
        os.close(fd)
    tq: ToolQueue = outbox_app.tq
    try:
        # When each has started: it says once that the server does not answer, and stays
        for role in ("worker", "scheduler", "relay"):
            assert wait_until(lambda r=role: "unavailable" in _said(logs[r]), timeout=30), (
                role,
                _said(logs[role])[-2000:],
            )
        for role in ("api", "mcp"):
            assert wait_until(lambda r=role: "serving anyway" in _said(logs[r]), timeout=30), (
                role,
                _said(logs[role])[-2000:],
            )
        assert wait_until(lambda: _health(api_port) == 503, timeout=30)  # QUEUE_UNAVAILABLE
        # and many requests meanwhile (each answered at once, the outage said once)
        assert [_health(api_port) for _ in range(20)] == [503] * 20
        codes = anyio.run(_mcp_calls, f"http://127.0.0.1:{mcp_port}/mcp", 5)
        assert codes == ["QUEUE_UNAVAILABLE"] * 5, codes
        dead = {r: p.returncode for r, p in procs.items() if p.poll() is not None}
        assert not dead, (dead, {r: _said(logs[r])[-1500:] for r in dead})

        # Then, the server up, the deployment runs a call end to end
        server.start()
        tq.configure(redis_url=url)
        tq.app.configure_broker(broker)
        assert wait_until(lambda: _health(api_port) == 200, timeout=30)
        ref = tq.submit("pay", {}, operation_ref="start-down/1").operation_ref
        assert tq.wait(ref, timeout=60).ok
        for role in ("api", "mcp"):  # their probe saw it back (within 2 s)
            assert wait_until(lambda r=role: "back after" in _said(logs[r]), timeout=30), (
                role,
                _said(logs[role])[-2000:],
            )
        dead = {r: p.returncode for r, p in procs.items() if p.poll() is not None}
        assert not dead, (dead, {r: _said(logs[r])[-1500:] for r in dead})
    finally:
        tq.close()
        stop_processes(procs.values(), timeout=5)
    for role in ("worker", "scheduler", "relay"):
        said = _said(logs[role])
        assert said.count("unavailable (") == 1, (role, said[-3000:])
        assert "back after" in said, (role, said[-3000:])
    # the API and the MCP server: the start's line, then one for the requests that
    # failed (25 and 5 of them), one when it came back
    for role in ("api", "mcp"):
        said = _said(logs[role])
        assert said.count("serving anyway") == 1, (role, said[-3000:])
        assert said.count("queue server unavailable (") == 1, (role, said[-3000:])
        assert said.count("queue server back after") == 1, (role, said[-3000:])


async def _mcp_calls(url: str, n: int) -> list[str]:
    """``n`` calls of ``pay`` through the MCP SDK's client: each envelope's code."""
    async with Client(streamable_http_client(url)) as c:
        results = [await c.call_tool("pay", {}) for _ in range(n)]
    return [str((r.structured_content or {}).get("code")) for r in results]


def test_event_streams_open_when_the_server_goes_away_end_cleanly_said_once(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    # Given the API with three event streams following operations nobody runs yet
    server.start()
    url = url_for_db(server.url, 0)
    port = free_port()
    api_log, fd = _log(tmp_path, "api")
    api = start_toolq(
        ["api", "--app", "tests.integration.apps.runtime_app:tq", "--port", str(port)],
        # a keep-alive a second: a stream reads its history again that often
        env={"TOOLQ_REDIS_URL": url, "TOOLQ_API_KEEPALIVE": "1"},
        stderr=fd,
    )
    os.close(fd)
    tq: ToolQueue = runtime_app.tq
    tq.configure(redis_url=url)
    refs = [tq.submit("pay", {}, operation_ref=f"streams/{i}").operation_ref for i in range(3)]
    base = f"http://127.0.0.1:{port}"
    seen: dict[str, list[str]] = {ref: [] for ref in refs}
    ended: dict[str, str] = {}

    def follow(ref: str) -> None:
        try:
            with httpx.stream("GET", f"{base}/v1/operations/{ref}/events", timeout=60) as r:
                seen[ref].append(str(r.status_code))
                for line in r.iter_lines():
                    seen[ref].append(line)
            ended[ref] = "\n".join(seen[ref])
        except httpx.HTTPError as exc:  # a body broken off: RemoteProtocolError
            ended[ref] = f"broken: {exc!r}"

    try:
        assert wait_until(lambda: _health(port) == 200, timeout=30)
        streams = [threading.Thread(target=follow, args=(ref,)) for ref in refs]
        for t in streams:
            t.start()
        assert wait_until(lambda: all("event: state" in seen[r] for r in refs), timeout=30)

        # When the server goes away
        server.kill()
        for t in streams:
            t.join(timeout=60)

        # Then every stream ended cleanly after what it had sent (its client resumes
        # from Last-Event-ID), and the API said the outage once, without a traceback
        for ref in refs:
            assert ended.get(ref, "").startswith("200\n"), ended
            assert "event: state" in ended[ref], ended[ref]
        server.start()
        assert wait_until(lambda: _health(port) == 200, timeout=30)
        assert wait_until(lambda: "queue server back after" in _said(api_log), timeout=30)
        assert api.poll() is None
    finally:
        tq.close()
        stop_processes((api,), timeout=5)
    said = _said(api_log)
    assert said.count("queue server unavailable (") == 1, said[-3000:]
    assert "Traceback" not in said and "unhandled error" not in said, said[-3000:]
