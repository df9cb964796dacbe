"""Long request lines and headers, and requests that never end, against a real
``toolq api`` process.

Each long one is refused with a 4xx before any work (414 and 431 from the size
guard; 400 from uvicorn's parser once a head outgrows its buffer), and
``/v1/health`` keeps answering meanwhile. Before the guard an 8,000-character URL
was answered 200 after its access-log line held the event loop for seconds; 64 KB
for minutes. The latency under this load is measured in bench/api_abuse.py, not
asserted here. A request that stops half way is answered 408 and its connection
closed once ``TOOLQ_API_REQUEST_TIMEOUT`` (here :data:`REQUEST_TIMEOUT`) has passed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port, start_toolq, stop_process, wait_until
from tests.integration.apps.interfaces_app import APP

SIZES = {"8 KB": 8 << 10, "64 KB": 64 << 10, "1 MB": 1 << 20}
#: Seconds the API waits for a request to arrive whole (the default is 10).
REQUEST_TIMEOUT = 3


@pytest.fixture(scope="module")
def api(module_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    log = tmp_path_factory.mktemp("api") / "api.log"
    with log.open("ab") as out:
        proc = start_toolq(
            ["api", "--app", APP, "--redis-url", module_redis_url, "--port", str(port)],
            env={
                "TOOLQ_API_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT),
                "TOOLQ_API_KEEPALIVE": str(REQUEST_TIMEOUT * 2),
            },
            unset=("TOOLQ_API_TOKENS",),
            stdout=out.fileno(),
            stderr=subprocess.STDOUT,
        )
    try:
        assert wait_until(lambda: _healthy(port, proc, log), timeout=30), log.read_text()
        yield port
    finally:
        stop_process(proc)


def _healthy(port: int, proc: subprocess.Popen[bytes], log: Path) -> bool:
    assert proc.poll() is None, log.read_text()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=10) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _exchange(port: int, head: bytes) -> int:
    """Send ``head`` on a new connection; the status line's code (0 if none came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        # Refused mid-send: the answer is still in our receive buffer.
        with contextlib.suppress(OSError):
            s.sendall(head)
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _long_line(size: int) -> bytes:
    return b"GET /v1/health?q=" + b"a" * size + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _long_header(size: int) -> bytes:
    return b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * size + b"\r\n\r\n"


@pytest.mark.parametrize("shape", [_long_line, _long_header], ids=["request line", "header"])
@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_a_long_request_is_refused_and_health_keeps_answering(
    api: int, shape: object, size: int
) -> None:
    assert callable(shape)
    head = shape(size)
    statuses: list[int] = []
    done = threading.Event()

    def abuse() -> None:
        # Given a client that sends the long request again and again
        try:
            for _ in range(5):
                statuses.append(_exchange(api, head))
        finally:
            done.set()

    thread = threading.Thread(target=abuse, daemon=True)
    thread.start()
    # When health is asked meanwhile, it answers each time (each within urlopen's timeout)
    answered = 0
    while not done.is_set() or answered < 3:
        with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/health", timeout=10) as r:
            assert r.status == 200
        answered += 1
    thread.join(timeout=60)
    # Then every long request was refused with a 4xx
    assert len(statuses) == 5 and all(400 <= s < 500 for s in statuses), statuses
    expected = 414 if shape is _long_line else 431
    # (past the parser's buffer, uvicorn may answer 400 before the guard sees it)
    assert size >= 64 << 10 or set(statuses) == {expected}, statuses


def test_requests_within_the_limits_are_served(api: int) -> None:
    assert _exchange(api, _long_line(2000)) == 200
    assert _exchange(api, _long_header(4000)) == 200


_POST_HEAD = (
    b"POST /v1/tools/create_note:invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Idempotency-Key: slow_body\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


@pytest.mark.parametrize(
    "part",
    [
        b"",  # a connection opened and never used
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a",  # half a head
        _POST_HEAD + b'{"body":',  # a head and part of its body
    ],
    ids=["nothing", "half a head", "part of a body"],
)
def test_a_request_that_stops_half_way_is_not_waited_for(api: int, part: bytes) -> None:
    # Given a client that sends part of a request, then nothing more (slowloris)
    with socket.create_connection(("127.0.0.1", api), timeout=REQUEST_TIMEOUT * 10) as s:
        s.sendall(part)

        # When it waits: the server answers (408 once it had something) and closes;
        # before, it held the connection (and its file descriptor) forever
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    if part:
        assert data.startswith(b"HTTP/1.1 408 "), data
        assert data.endswith(
            b'"code": "REQUEST_TIMEOUT", "message": "the request did not arrive within 3 s"}'
        ), data
    else:
        assert data == b""


@pytest.mark.parametrize(
    "upgrade", ["", "Connection: Upgrade\r\nUpgrade: h2c\r\n"], ids=["plain", "Upgrade: h2c"]
)
def test_a_request_in_whole_is_held_past_the_deadline(api: int, upgrade: str) -> None:
    # Given an operation no worker runs (none serves this module), and its event stream
    ref = f"held_{uuid.uuid4().hex[:8]}"
    invoke = urllib.request.Request(
        f"http://127.0.0.1:{api}/v1/tools/echo:invoke",
        data=b'{"text": "x"}',
        headers={"Idempotency-Key": ref, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(invoke, timeout=30) as r:
        assert r.status == 202
    with socket.create_connection(("127.0.0.1", api), timeout=REQUEST_TIMEOUT * 10) as s:
        s.sendall(
            f"GET /v1/operations/{ref}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n{upgrade}\r\n".encode()
        )

        # When it waits: its first keep-alive comes (2 x the deadline after it opened),
        # with an Upgrade header too (curl --http2 sends one: such a stream was cut)
        data = b""
        while b": keep-alive" not in data and (chunk := s.recv(4096)):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and b": keep-alive" in data, data


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/operations/caf\xc3\xa9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /v1/health HTTP/1.1\r\n\r\n",
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
    ],
    ids=["raw UTF-8 in the target", "no Host", "two Hosts"],
)
def test_a_request_that_is_not_http_is_refused_with_a_typed_error(api: int, head: bytes) -> None:
    # Given bytes h11 refuses to parse as a request
    with socket.create_connection(("127.0.0.1", api), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(4096):
            data += chunk

    # Then the 400 has a JSON body with a code, as every refusal of ours (it was text)
    status, _, body = data.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in status
    assert json.loads(body) == {
        "code": "MALFORMED_REQUEST",
        "message": "the request is not valid HTTP/1.1",
    }


def test_a_request_framed_both_by_length_and_by_chunks_is_refused_and_runs_nothing(
    api: int,
) -> None:
    # Given an invoke framed two ways: a proxy in front reading Content-Length and this
    # server reading the chunks would take different requests from the same bytes
    body = b'{"text": "smuggled"}'
    head = (
        b"POST /v1/tools/echo:invoke HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Idempotency-Key: framed/1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", api), timeout=30) as s:
        s.sendall(head + chunked)
        data = b""
        while chunk := s.recv(4096):  # the server closes the connection after it
            data += chunk

    # Then it is refused with a typed 400, and nothing was submitted
    status, _, answer = data.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 "), data
    assert json.loads(answer)["code"] == "MALFORMED_REQUEST"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/operations/framed/1", timeout=30)
    assert missing.value.code == 404
    missing.value.close()
