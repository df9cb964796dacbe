"""A ledger on a unix socket (``unix:///path?db=N``, redis-py's name for it): the client,
a worker and ``toolq submit --wait`` run a call through it, as over TCP."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import start_worker, stop_process, toolq_env
from tests.integration.apps.cli_app import APP
from toolq.adapters.embedded.server import EmbeddedServer

#: No AOF on this throwaway server: the processes are told not to ask for it.
ENV = {"TOOLQ_DURABILITY": "none"}


@pytest.fixture(scope="module")
def socket_url() -> Iterator[str]:
    # A short directory: a socket's path has at most 107 bytes
    with tempfile.TemporaryDirectory(prefix="tq-") as where:
        sock = Path(where) / "v.sock"
        server = EmbeddedServer(appendonly=False, extra_config={"unixsocket": str(sock)})
        server.start()
        try:
            yield f"unix://{sock}?db=3"
        finally:
            server.stop()


def test_a_call_runs_through_a_ledger_on_a_unix_socket(socket_url: str) -> None:
    # Given a worker on the socket (kombu has no unix transport: a KeyError at its start)
    worker = start_worker(APP, socket_url, env=ENV)
    try:
        # When a call is submitted there and waited for
        call = ["submit", "echo", "--args", '{"text": "hi"}', "--wait", "60"]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "toolq.edges.cli",
                *call,
                "--app",
                APP,
                "--redis-url",
                socket_url,
            ],
            env=toolq_env(ENV),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop_process(worker)
    # Then it succeeded (the client failed first: socket_keepalive is no unix option)
    assert result.returncode == 0, result.stderr
    assert '"text": "hi"' in result.stdout


@pytest.mark.parametrize(
    ("url", "kombu"),
    [
        ("unix:///run/v.sock", "redis+socket:///run/v.sock"),
        (
            "unix:///run/v.sock?db=2&password=pw",
            "redis+socket:///run/v.sock?virtual_host=2&password=pw",
        ),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_a_unix_url_is_named_as_kombu_names_it(url: str, kombu: str) -> None:
    from toolq.adapters.broker.app import kombu_url

    assert kombu_url(url) == kombu
