"""A ``rediss://`` URL to a server that speaks no TLS on that port: the session's own
Valkey (plain). A long-running process waits, as for a server away, and its one line
says to check TLS; it used to say "TimeoutError" alone, as if the server were away."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers import start_toolq, stop_processes, wait_until
from tests.integration.apps.cli_app import APP

ADVICE = "a rediss:// URL speaks TLS: if the server does not on that port, use redis://"


def test_a_scheduler_given_rediss_to_a_plain_server_waits_and_says_check_tls(
    valkey: str, tmp_path: Path
) -> None:
    # Given the session's server, which serves no TLS, named by a rediss:// URL
    assert valkey.startswith("redis://")
    url = "rediss://" + valkey.removeprefix("redis://")
    log = tmp_path / "scheduler.log"
    with log.open("wb") as f:
        fd = os.dup(f.fileno())
    # When a scheduler starts on it
    proc = start_toolq(["scheduler", "--app", APP], env={"TOOLQ_REDIS_URL": url}, stderr=fd)
    os.close(fd)
    try:
        # Then it says once that the server is unavailable, with what to check, and waits
        assert wait_until(lambda: ADVICE in log.read_text(errors="replace"), timeout=60), (
            log.read_text(errors="replace")[-2000:]
        )
        time.sleep(1.0)  # a try or two more: still one line, still running
        said = log.read_text(errors="replace")
        assert said.count("unavailable (") == 1, said[-2000:]  # TimeoutError, or a TLS error
        assert proc.poll() is None, said[-2000:]
        assert "Traceback" not in said, said[-2000:]
    finally:
        stop_processes([proc], timeout=5)
