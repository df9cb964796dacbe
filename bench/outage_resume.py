"""How soon toolq resumes after a dependency comes back (issue 25).

``python -m bench.outage_resume [--ledger-down 60] [--broker-down 20]``

Two runs, each on servers of its own (an embedded Valkey; RabbitMQ from Debian's
``rabbitmq-server`` for the broker run):

* **ledger**: a worker and a scheduler on the ledger's server (also Celery's
  broker); the server SIGKILLed, kept down ``--ledger-down`` s, started again on
  the same port; a call submitted as soon as it answers PING.
* **broker** (outbox mode): a worker, a scheduler and a relay, the broker RabbitMQ;
  RabbitMQ SIGKILLed, a call submitted while it is down, RabbitMQ kept down
  ``--broker-down`` s and started again on the same port.

The figure: seconds from the dependency answering again (a prober thread connecting
every 20 ms: PING, an AMQP connection) to the call's success being recorded (its
envelope's ``verification.checked_at``), and whether every process is still the one
started. Raw numbers go to ``bench/results/outage-resume.json`` (``BENCH_OUT``
elsewhere, as every bench's: a trial run must not overwrite the measured file).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.apps import tq
from bench.procs import Child, python_child, toolq_scheduler, toolq_worker
from bench.report import RAW
from toolq.adapters.embedded import EmbeddedServer

APP = "bench.apps:tq"
OUT = RAW / "outage-resume.json"


class Prober:
    """Records when ``answers()`` first returns true (wall clock), trying every 20 ms."""

    def __init__(self, answers: Any) -> None:
        self.at: float | None = None
        self._answers = answers
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.at is None:
            try:
                if self._answers():
                    self.at = time.time()
                    return
            except Exception:  # not up yet
                time.sleep(0.02)

    def wait(self) -> float:
        self._thread.join()
        assert self.at is not None
        return self.at


def _ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


def _amqp(url: str) -> bool:
    from kombu import Connection

    with Connection(url, connect_timeout=0.5) as conn:
        conn.connect()
        return True


def _done_at(ref: str) -> tuple[bool, float]:
    """Whether the call succeeded, and when its success was recorded (wall clock)."""
    env = tq.wait(ref, timeout=120)
    return env.ok, env.verification.checked_at.timestamp() if env.ok else time.time()  # type: ignore[union-attr]


def _warm(ref: str) -> None:
    assert tq.wait(tq.submit("noop", {}, operation_ref=ref).operation_ref, timeout=60).ok


def ledger_run(down_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp) / "v", appendonly=True).start()
        url = str(server.url)
        tq.configure(redis_url=url)
        procs = [
            toolq_worker("outage-worker", APP, url, pool="threads", concurrency=4,
                         queues="toolq.calls,toolq.verify", loglevel="INFO"),
            toolq_scheduler("outage-scheduler", APP, url),
        ]  # fmt: skip
        try:
            _warm("outage/ledger/warm")
            server.kill()
            time.sleep(down_s)
            prober = Prober(lambda: _ping(server.port))
            server.start()  # returns once it answers PING
            ref = tq.submit("noop", {}, operation_ref="outage/ledger/after").operation_ref
            ok, done = _done_at(ref)
            return _result("ledger", down_s, done - prober.wait(), ok, procs)
        finally:
            _stop(procs)
            tq.close()
            server.stop()


def broker_run(down_s: float) -> dict[str, Any]:
    from tests.rabbit import start_rabbit  # Debian's rabbitmq-server, as the tests run it

    rabbit = start_rabbit()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp) / "v", appendonly=True).start()
        url = str(server.url)
        env = {"TOOLQ_BROKER_URL": rabbit.url}
        tq.configure(redis_url=url)
        tq.app.configure_broker(rabbit.url)
        procs = [
            toolq_worker("outage-b-worker", APP, url, pool="threads", concurrency=4,
                         queues="toolq.calls,toolq.verify", env=env, loglevel="INFO"),
            toolq_scheduler("outage-b-scheduler", APP, url, env=env),
            python_child("outage-b-relay", ["-m", "toolq.edges.cli", "relay", "--app", APP,
                                            "--redis-url", url], {**env}),
        ]  # fmt: skip
        try:
            _warm("outage/broker/warm")
            rabbit.kill()
            ref = tq.submit("noop", {}, operation_ref="outage/broker/during").operation_ref
            time.sleep(down_s)
            prober = Prober(lambda: _amqp(rabbit.url))
            rabbit.start()  # returns once it takes an AMQP connection
            ok, done = _done_at(ref)
            return _result("broker", down_s, done - prober.wait(), ok, procs)
        finally:
            _stop(procs)
            tq.close()
            server.stop()
            rabbit.stop()


def _result(what: str, down_s: float, took: float, ok: bool, procs: list[Child]) -> dict[str, Any]:
    alive = {p.name: p.alive() for p in procs}
    print(
        f"{what} down {down_s:g} s: first call done {took:.2f} s after it answered "
        f"(ok={ok}; processes alive: {alive})",
        flush=True,
    )
    return {"dependency": what, "down_s": down_s, "resume_s": round(took, 3), "ok": ok,
            "alive": alive}  # fmt: skip


def _stop(procs: list[Child]) -> None:
    for p in procs:
        p.stop(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger-down", type=float, default=60.0)
    parser.add_argument("--broker-down", type=float, default=20.0)
    parser.add_argument("--only", choices=["ledger", "broker"], default=None)
    a = parser.parse_args()
    results = []
    if a.only in (None, "ledger"):
        results.append(ledger_run(a.ledger_down))
    if a.only in (None, "broker"):
        results.append(broker_run(a.broker_down))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
