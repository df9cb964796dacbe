"""The Celery-on-Redis traps DESIGN.md lists, closed by configuration and by
never using Celery's delays (the behavioural side is in tests/integration)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr, ValidationError

from toolq import ToolQueue
from toolq.adapters.broker.app import celery_config
from toolq.core.settings import QueueSettings, ToolqSettings

ROOT = Path(__file__).resolve().parents[2] / "toolq"


def test_safe_celery_settings() -> None:
    s = ToolqSettings(
        redis_url=SecretStr("redis://h:6379/0"), queues=QueueSettings(visibility_timeout=1234)
    )
    c = celery_config(s, s.url)
    assert c["task_serializer"] == "json" and c["accept_content"] == ["json"]
    assert c["result_accept_content"] == ["json"]
    assert c["task_acks_late"] and c["task_reject_on_worker_lost"]
    assert c["worker_prefetch_multiplier"] == 1
    # one visibility timeout, everywhere Celery and kombu read it
    assert c["broker_transport_options"]["visibility_timeout"] == 1234
    assert c["result_backend_transport_options"]["visibility_timeout"] == 1234
    assert c["visibility_timeout"] == 1234
    assert {q.name for q in c["task_queues"]} == {"toolq.calls", "toolq.verify"}
    assert not c["worker_send_task_events"]  # off unless asked, as in Celery
    # a worker never gives up on its broker (Celery: after 100 tries), and a call
    # running when the connection drops finishes (the ledger's claim refuses the copy)
    assert c["broker_connection_max_retries"] is None and c["broker_connection_retry"]
    assert c["worker_cancel_long_running_tasks_on_connection_loss"] is False


def test_no_celery_delay_or_retry_anywhere_in_toolq() -> None:
    pattern = re.compile(r"\b(countdown|eta)\s*=|\.retry\(|autoretry_for|apply_async|pickle")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in ROOT.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "url",
    ["redis://:s3cr3t-pw@127.0.0.1:6379/0", "rediss://user:s3cr3t-pw@cache.example:6380/2"],
)
def test_a_password_never_appears_in_repr_or_errors(url: str) -> None:
    tq = ToolQueue(redis_url=url)
    assert "s3cr3t-pw" not in repr(tq)
    assert "s3cr3t-pw" not in repr(tq.settings)
    assert "s3cr3t-pw" not in str(tq.describe())
    assert tq.redis_url == url  # still usable


def test_a_url_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ValueError, match="redis://"):
        ToolQueue(redis_url="http://user:pw@host/")


@pytest.mark.parametrize(
    ("url", "ours"),
    [
        ("redis://h:6379/0", True),
        ("rediss://h:6380/0", False),  # kombu's own: it reads TLS from the scheme
        ("unix:///tmp/redis.sock", False),
    ],
)
def test_redis_brokers_get_the_one_client_per_channel_transport(url: str, ours: bool) -> None:
    c = celery_config(ToolqSettings(), url)
    assert (c.get("broker_transport") == "toolq.adapters.broker.transport:Transport") is ours


@pytest.mark.parametrize(
    ("url", "ours"), [("redis://h:6379/0", True), ("rediss://h:6380/0", False)]
)
def test_a_url_given_after_the_app_was_built_switches_the_transport_too(
    url: str, ours: bool
) -> None:
    # `toolq worker --redis-url`, the embedded server and the bench all configure the URL
    # after the Celery app exists: the transport must follow it, not stay kombu's.
    tq = ToolQueue()
    assert tq.celery.conf.broker_url is None  # built without a URL
    tq.configure(redis_url=url)
    transport = tq.celery.connection_for_write().transport
    assert (type(transport).__module__ == "toolq.adapters.broker.transport") is ours
    assert tq.celery.conf.broker_url == url


def test_task_events_are_asked_for_by_setting_or_flag() -> None:
    from toolq.core.settings import WorkerSettings
    from toolq.services.workers.main import worker_argv

    on = ToolqSettings(worker=WorkerSettings(task_events=True))
    assert celery_config(on, "redis://h:6379/0")["worker_send_task_events"]
    assert "--task-events" in worker_argv(QueueSettings(), events=True)
    assert "--task-events" not in worker_argv(QueueSettings())


def test_toolq_up_passes_events_to_its_workers_only_when_asked() -> None:
    from toolq.edges.stack import Stack, StackConfig

    def worker_argvs(events: bool) -> list[list[str]]:
        plan = Stack(StackConfig(app="m:tq", redis_url="redis://h:1/0", events=events))._plan()
        return [c.argv for c in plan if c.role in ("calls", "verify")]

    assert all("--events" in argv for argv in worker_argvs(True))
    assert not any("--events" in argv for argv in worker_argvs(False))


def test_prefetch_is_one_unless_set_and_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLQ_WORKER__PREFETCH_MULTIPLIER", "4")
    assert celery_config(ToolqSettings(), None)["worker_prefetch_multiplier"] == 4
    monkeypatch.setenv("TOOLQ_WORKER__PREFETCH_MULTIPLIER", "0")
    with pytest.raises(ValidationError, match="prefetch_multiplier"):
        ToolqSettings()


@pytest.mark.parametrize(
    ("setting", "slots", "reserve"),
    [(None, 1, 0), (None, 2, 0), (None, 7, 0), (None, 8, 1), (None, 15, 1), (None, 16, 2),
     (None, 64, 8), (None, 0, 0), (0, 16, 0), (5, 2, 5)],
)  # fmt: skip
def test_the_reserve_is_one_per_eight_slots_none_below_eight_unless_set(
    setting: int | None, slots: int, reserve: int
) -> None:
    from toolq.adapters.broker.consumer import reserve_for

    assert reserve_for(setting, slots) == reserve


@pytest.mark.parametrize(
    ("slots", "multiplier", "reserve", "count"),
    [(16, 1, 2, 18), (2, 4, 1, 9), (16, 1, 0, 16), (0, 1, 2, 0)],
)  # fmt: skip
def test_prefetch_count_adds_the_reserve_and_keeps_no_limit(
    slots: int, multiplier: int, reserve: int, count: int
) -> None:
    from toolq.adapters.broker.consumer import prefetch_count

    assert prefetch_count(slots, multiplier, reserve) == count


def test_the_reserve_reaches_the_worker_and_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = celery_config(ToolqSettings(), None)
    assert c["worker_consumer"] == "toolq.adapters.broker.consumer:Consumer"
    assert c["toolq_worker_reserve"] is None  # the consumer works it out from the pool
    monkeypatch.setenv("TOOLQ_WORKER__RESERVE", "3")
    assert celery_config(ToolqSettings(), None)["toolq_worker_reserve"] == 3
    monkeypatch.setenv("TOOLQ_WORKER__RESERVE", "-1")
    with pytest.raises(ValidationError, match="reserve"):
        ToolqSettings()


class _Qos:
    def __init__(self) -> None:
        self.moves: list[int] = []

    def increment_eventually(self, n: int) -> None:
        self.moves.append(n)

    def decrement_eventually(self, n: int) -> None:
        self.moves.append(-n)


@pytest.mark.parametrize(
    ("before", "after", "setting", "prefetch", "moves"),
    [(7, 8, None, 9, [1, 1]), (8, 7, None, 7, [-1, -1]), (16, 17, None, 19, [1]),
     (2, 3, 0, 3, [1]), (2, 3, 2, 5, [1])],
)  # fmt: skip
def test_a_pool_that_grows_or_shrinks_moves_the_prefetch_by_its_reserve_too(
    before: int, after: int, setting: int | None, prefetch: int, moves: list[int]
) -> None:
    """Celery moves the live prefetch by the slots' share (the last move); the reserve's
    own change comes first (to eight slots: one more)."""
    from types import SimpleNamespace

    from toolq.adapters.broker.consumer import Consumer, reserve_for

    qos = _Qos()
    c = SimpleNamespace(
        pool=SimpleNamespace(num_processes=after),
        app=SimpleNamespace(conf={"toolq_worker_reserve": setting}),
        prefetch_multiplier=1,
        initial_prefetch_count=before + reserve_for(setting, before),
        _toolq_reserve=reserve_for(setting, before),
        qos=qos,
    )
    c._update_qos_eventually = lambda index: qos.moves.append(index)
    Consumer._update_prefetch_count(c, after - before)  # type: ignore[arg-type]
    assert c.initial_prefetch_count == prefetch
    assert qos.moves == moves


@pytest.mark.parametrize(
    ("loglevel", "quiet"),
    [
        ("WARNING", True),
        ("warning", True),
        ("ERROR", True),
        ("30", True),
        ("INFO", False),
        ("info", False),
        ("DEBUG", False),
    ],
)
def test_a_worker_prints_celerys_banner_only_at_info_or_below(loglevel: str, quiet: bool) -> None:
    from toolq.services.workers.main import worker_argv

    argv = worker_argv(QueueSettings(), loglevel=loglevel)
    # --quiet is the celery command's own option: before the subcommand
    assert ("--quiet" in argv[: argv.index("worker")]) is quiet
    assert argv[argv.index("--loglevel") + 1] == loglevel


def test_toolq_worker_defaults_to_warning_as_celerys_worker_does() -> None:
    from click.testing import CliRunner

    from toolq.edges.cli import main
    from toolq.services.workers.main import DEFAULT_LOGLEVEL, worker_argv

    assert DEFAULT_LOGLEVEL == "WARNING"
    assert "--quiet" in worker_argv(QueueSettings())
    shown = CliRunner().invoke(main, ["worker", "--help"]).output
    assert "[default: WARNING]" in shown


@pytest.mark.parametrize(
    ("level", "received_logged"),
    [(logging.DEBUG, True), (logging.INFO, False), (logging.WARNING, False)],
)
def test_a_task_received_line_only_at_debug(level: int, received_logged: bool) -> None:
    from toolq.services.workers.main import quiet_task_received

    strategy = logging.getLogger("celery.worker.strategy")
    before = strategy.level
    try:
        strategy.setLevel(logging.NOTSET)
        quiet_task_received(level)
        # What Celery's strategy reads once to decide whether it logs "received"
        root = logging.getLogger()
        root_before = root.level
        root.setLevel(level)
        try:
            assert strategy.isEnabledFor(logging.INFO) is received_logged
        finally:
            root.setLevel(root_before)
    finally:
        strategy.setLevel(before)


def test_kombus_eta_warning_is_dropped_and_its_other_warnings_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a toolq Celery app (it installs its log filters)
    from kombu import Connection, Exchange, Queue
    from kombu.transport.native_delayed_delivery import (
        bind_queue_to_native_delayed_delivery_exchange,
    )

    from toolq.adapters.broker.app import make_celery
    from toolq.adapters.broker.messages import DELAYED_DELIVERY_LOGGER

    make_celery(ToolqSettings())
    caplog.set_level(logging.WARNING)
    # When kombu binds toolq's direct-exchange queue for native delayed delivery, as a
    # worker on RabbitMQ quorum queues does at start
    with Connection("memory://") as conn:
        queue = Queue("toolq.calls", Exchange("toolq.calls", type="direct"), "toolq.calls")
        bind_queue_to_native_delayed_delivery_exchange(conn, queue)
    logging.getLogger(DELAYED_DELIVERY_LOGGER).warning("Failed to setup delayed delivery")
    # Then its "ETA tasks … will block the worker" warning is not logged; others are
    said = [r.getMessage() for r in caplog.records]
    assert not any("ETA tasks" in m or "direct exchange" in m for m in said), said
    assert "Failed to setup delayed delivery" in said


def test_a_unix_socket_url_makes_a_client_that_connects() -> None:
    # The pool's options once held socket_keepalive, which the unix socket's connection
    # class refuses: a TypeError at the first command, whatever the server.
    tq = ToolQueue(redis_url="unix:///nonexistent/toolq-test.sock")
    try:
        with pytest.raises(redis.ConnectionError, match="No such file"):
            tq.redis.ping()
    finally:
        tq.close()
