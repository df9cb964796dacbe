"""`toolq up` says it serves once its HTTP endpoints take connections (toolq.stack)."""

from __future__ import annotations

import socket

from toolq.stack import Stack, StackConfig, free_port


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
