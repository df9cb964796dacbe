"""`toolq up` says it serves once its HTTP endpoints take connections (toolq.edges.stack)."""

from __future__ import annotations

import os
import socket

import pytest

from toolq.edges.cli.common import CliError
from toolq.edges.cli.stack import _ports
from toolq.edges.stack import Stack, StackConfig, deployment_id, free_port, node_name


def test_up_waits_for_its_endpoints_to_take_connections() -> None:
    """`toolq up` prints the metrics and API addresses once they answer (the children bind
    them a moment after they start); one that never does is named after the timeout."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        serving = Stack(StackConfig(app="m:tq", redis_url="redis://h:1/0", metrics_port=port))
        assert serving.wait_serving(timeout=5) == []
        silent = Stack(
            StackConfig(
                app="m:tq",
                redis_url="redis://h:1/0",
                metrics_port=port,
                api_host="0.0.0.0",
                api_port=free_port(),
            )
        )
        assert silent.wait_serving(timeout=0.5) == ["api"]
    assert Stack(StackConfig(app="m:tq", redis_url="redis://h:1/0")).wait_serving() == []


def _time_wait_port() -> int:
    """A port whose only socket is a TIME_WAIT connection, as a killed API leaves: the
    server side accepted a connection and closed it first."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port: int = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server's side closes first: its end waits in TIME_WAIT
        client.recv(1)
        client.close()
    return port


def test_the_port_check_accepts_a_port_left_in_time_wait() -> None:
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):  # what the check did before
        plain.bind(("127.0.0.1", port))
    assert _ports({"api": (port, "127.0.0.1")}) == {"api": port}


def test_the_port_check_refuses_a_port_listened_on() -> None:
    with socket.socket() as listening:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        with pytest.raises(CliError, match=f"port {port} for api on 127.0.0.1 is in use"):
            _ports({"api": (port, "127.0.0.1")})


def test_worker_node_names_are_unique_per_deployment() -> None:
    """Two deployments on one RabbitMQ vhost: each node name has one exclusive control
    queue (`<name>.celery.pidbox`), so the same name in both is refused to the second."""
    one, two = (Stack(StackConfig(app="m:tq", redis_url="redis://h:1/0")) for _ in range(2))
    names = [
        [c.argv[c.argv.index("--hostname") + 1] for c in s._plan() if "--hostname" in c.argv]
        for s in (one, two)
    ]
    assert one.config.deployment != two.config.deployment
    assert names[0] == [
        f"calls-1.{one.config.deployment}@%h",
        f"verify-1.{one.config.deployment}@%h",
    ]
    assert not set(names[0]) & set(names[1])
    assert node_name("calls-2", "4242") == "calls-2.4242@%h"
    assert deployment_id().startswith(f"{os.getpid()}-")  # not this process's first stack


def test_every_port_in_use_is_named_in_one_refusal_and_free_ones_are_picked() -> None:
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        one, two = a.getsockname()[1], b.getsockname()[1]
        with pytest.raises(CliError) as refused:
            _ports({"metrics": (one, "127.0.0.1"), "api": (two, "127.0.0.1")})
    lines = refused.value.message.splitlines()
    assert lines[0] == "2 ports are in use:"
    assert [ln.split(" is in use")[0] for ln in lines[1:]] == [
        f"port {one} for metrics on 127.0.0.1",
        f"port {two} for api on 127.0.0.1",
    ]
    chosen = _ports({"metrics": (0, "127.0.0.1"), "api": (None, "127.0.0.1")})
    assert chosen["api"] is None and isinstance(chosen["metrics"], int) and chosen["metrics"] > 0
