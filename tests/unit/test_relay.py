"""The relay (issue 18): what it publishes (the ledger's message, built for kombu's Redis
transport, unpacked so that any kombu transport delivers what Celery itself would), and
its rounds on fakeredis and kombu's in-memory broker: publish, acknowledge and delete;
take over what a dead relay left; forget dead relays' beats."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from amqp.exceptions import MessageNacked
from kombu import Connection
from kombu.exceptions import OperationalError
from pydantic import SecretStr

from toolq import ToolQueue
from toolq.adapters.ledger.outbox import entry_ms
from toolq.core.settings import ToolqSettings
from toolq.services.relay.outgoing import lag_ms, outgoing
from toolq.services.relay.service import Relay
from toolq.topology import Topology, topology_for


@pytest.fixture(scope="module")
def tq() -> ToolQueue:
    return ToolQueue(redis_url="redis://127.0.0.1:1/0")


def test_an_entry_carries_celerys_own_body_headers_and_properties(tq: ToolQueue) -> None:
    queue, raw = tq.app.messages.run("op/1", 2, tool="pay")
    out = outgoing("1700000000000-0", {"queue": queue, "message": raw})
    assert out is not None
    headers = out.headers
    ref = tq.app.messages.reference("toolq.run", ["op/1", 2], queue, headers["id"])
    assert out.queue == queue == "toolq.calls"
    assert json.loads(out.body) == json.loads(base64.b64decode(ref["body"]))
    assert json.loads(out.body)[0] == ["op/1", 2]
    assert (out.content_type, out.content_encoding) == ("application/json", "utf-8")
    assert {k: v for k, v in headers.items() if k != "argsrepr"} == {
        k: v for k, v in ref["headers"].items() if k != "argsrepr"
    }
    assert headers["argsrepr"] == "pay('op/1', attempt=2)"
    # the transport's own properties (delivery tag, body encoding) are not passed on
    assert out.properties == {"correlation_id": headers["id"]}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"queue": "q"},
        {"message": "{}"},
        {"queue": "q", "message": "not json"},
        {"queue": "q", "message": json.dumps({"body": "***"})},
        {"queue": "q", "message": json.dumps({"headers": {}})},
        {"queue": "q", "message": json.dumps({"body": "e30=", "headers": []})},
    ],
)
def test_an_entry_that_holds_no_message_is_none(fields: dict[str, str]) -> None:
    assert outgoing("1-0", fields) is None


@pytest.mark.parametrize(
    ("ids", "now", "lag"),
    [([], 5_000, 0), (["1000-0", "3000-1"], 5_000, 4_000), (["x-1"], 5_000, 0)],
)
def test_lag_is_the_oldest_entrys_wait(ids: list[str], now: int, lag: int) -> None:
    assert lag_ms(ids, now) == lag
    assert entry_ms(b"1700000000123-7") == 1_700_000_000_123


class _Parts:
    """Enough of an App for :meth:`Relay._publish` (no ledger is touched)."""

    def __init__(self, settings: ToolqSettings) -> None:
        self.settings = settings
        self.clock = time.time

    redis: Any = None
    redis_url = "redis://127.0.0.1:1/0"

    @property
    def topology(self) -> Topology:
        return topology_for(self.settings)


def test_a_published_entry_arrives_as_celery_sends_a_task(tq: ToolQueue) -> None:
    # kombu's in-memory transport: a broker that is not Redis, in this process
    # (model_copy skips the URL check, which allows only real brokers)
    settings = tq.settings.model_copy(update={"broker_url": SecretStr("memory://")})
    relay = Relay(_Parts(settings))
    queue, raw = tq.app.messages.verify("op/2", 1, 3, tool="pay")
    out = outgoing("1-0", {"queue": queue, "message": raw})
    assert out is not None
    try:
        relay._publish([out])
        with Connection("memory://") as conn:
            message = conn.SimpleQueue(queue).get(timeout=5)
            assert message.headers["task"] == "toolq.verify"
            assert message.properties["correlation_id"] == message.headers["id"]
            assert message.content_type == "application/json"
            assert message.decode()[0] == ["op/2", 1, 3]
            assert message.delivery_info["routing_key"] == queue
            message.ack()
    finally:
        relay._drop_broker()


# --------------------------------------------------------------------------- the relay's rounds


class _LedgerParts(_Parts):
    def __init__(self, settings: ToolqSettings, client: Any) -> None:
        super().__init__(settings)
        self.redis = client
        from toolq.adapters.ledger import Ledger

        self.ledger = Ledger(client, settings.prefix, "none", outbox=True, cells=settings.cells)


def _memory_relay(tq: ToolQueue, client: Any, **hooks: Any) -> Relay:
    settings = tq.settings.model_copy(update={"broker_url": SecretStr("memory://")})
    settings.relay = settings.relay.model_copy(update={"claim_after": 0.2})
    relay = Relay(_LedgerParts(settings, client), **hooks)
    relay.setup()
    return relay


def _submit(tq: ToolQueue, client: Any, ref: str) -> None:
    from toolq.adapters.ledger import Ledger
    from toolq.core.states import State

    queue, message = tq.app.messages.run(ref, 1, tool="pay")
    Ledger(client, outbox=True).submit(
        ref=ref, tool="pay", args_json="{}", fp="f", call_id="", now_ms=1, max_attempts=1,
        deadline_ms=0, state=State.QUEUED, due_ms=1, queue=queue, message=message,
    )  # fmt: skip


def _drain(queue: str) -> list[str]:
    refs = []
    with Connection("memory://") as conn:
        q = conn.SimpleQueue(queue)
        while True:
            try:
                message = q.get(block=False)
            except q.Empty:
                return refs
            refs.append(message.decode()[0][0])
            message.ack()


def test_a_round_publishes_acknowledges_and_deletes(tq: ToolQueue, fake_redis: Any) -> None:
    _drain("toolq.calls")
    for ref in ("r/1", "r/2"):
        _submit(tq, fake_redis, ref)
    relay = _memory_relay(tq, fake_redis)
    try:
        assert relay.step(block=False) == 2
        assert _drain("toolq.calls") == ["r/1", "r/2"]
        assert fake_redis.xlen("{toolq}:outbox") == 0
        assert relay.step(block=False) == 0 and relay.lag_ms == 0
    finally:
        relay._drop_broker()


def test_a_relay_that_died_mid_batch_leaves_it_to_another(tq: ToolQueue, fake_redis: Any) -> None:
    from tests.helpers import wait_until

    _drain("toolq.calls")
    _submit(tq, fake_redis, "d/1")

    class Died(Exception):
        pass

    def die(batch: Any) -> None:
        raise Died

    # Given a relay that read the entry and never acknowledged it
    first = _memory_relay(tq, fake_redis, on_read=die)
    with pytest.raises(Died):
        first.step(block=False)
    assert fake_redis.xpending("{toolq}:outbox", "relays")["pending"] == 1
    # When another relay comes, after the entry has been idle past claim_after
    second = _memory_relay(tq, fake_redis)
    try:
        assert wait_until(lambda: second.step(block=False) == 1, 5)
        # Then it took the entry over, published it, and deleted it
        assert _drain("toolq.calls") == ["d/1"]
        assert fake_redis.xlen("{toolq}:outbox") == 0
    finally:
        first._drop_broker()
        second._drop_broker()


def test_beats_of_relays_gone_for_an_hour_are_forgotten(tq: ToolQueue, fake_redis: Any) -> None:
    relay = _memory_relay(tq, fake_redis)
    now = 10_000_000_000
    fake_redis.hset(
        "{toolq}:relays",
        mapping={
            "old": json.dumps({"at": now - 3_600_001, "lag_ms": 0}),
            "recent": json.dumps({"at": now - 5_000, "lag_ms": 0}),
            "garbage": "x",
        },
    )
    relay._forget_dead(now)
    assert set(fake_redis.hkeys("{toolq}:relays")) == {b"recent"}


def test_a_takeover_of_a_full_batch_looks_again_at_once(tq: ToolQueue, fake_redis: Any) -> None:
    from tests.helpers import wait_until

    _drain("toolq.calls")
    for i in range(3):
        _submit(tq, fake_redis, f"f/{i}")

    def die(batch: Any) -> None:
        raise RuntimeError("killed")

    first = _memory_relay(tq, fake_redis, on_read=die)
    with pytest.raises(RuntimeError):
        first.step(block=False)
    # a relay that takes over two at a time takes the third in its very next round
    second = _memory_relay(tq, fake_redis)
    second.batch = 2
    try:
        assert wait_until(lambda: second.step(block=False) == 2, 5)
        assert second.step(block=False) == 1
        assert _drain("toolq.calls") == ["f/0", "f/1", "f/2"]
    finally:
        first._drop_broker()
        second._drop_broker()


def test_a_redis_broker_gets_the_ledgers_message_as_it_is_and_a_failed_push_is_the_brokers(
    tq: ToolQueue,
) -> None:
    # A Redis broker's queue list holds kombu's Redis envelope, which the ledger built:
    # pushed unchanged (what the scripts push without an outbox), not re-published.
    from toolq.services.relay.service import BrokerUnavailable

    queue, raw = tq.app.messages.run("op/1", 1)
    out = outgoing("1-0", {"queue": queue, "message": raw})
    assert out is not None and out.raw == raw
    settings = ToolqSettings(
        redis_url=SecretStr("redis://127.0.0.1:1/0"),
        broker_url=SecretStr("redis://127.0.0.1:1/1"),  # nothing listens there
    )

    class Parts:
        clock = time.time
        redis_url = "redis://127.0.0.1:1/0"

        def __init__(self) -> None:
            self.settings = settings
            self.topology = topology_for(settings)

    relay = Relay(Parts())  # type: ignore[arg-type]
    with pytest.raises(BrokerUnavailable) as caught:
        relay._publish([out])
    # An OSError, so run() handles it as the broker's failure (read the batch again),
    # not the ledger's.
    assert isinstance(caught.value, OSError)
    assert isinstance(caught.value, relay._broker_errors)
    relay._drop_broker()


# --------------------------------------------------------------------------- outages


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        # what Connection.default_channel raised after ~8 s of RabbitMQ down: it ended
        # every relay with something to publish
        (OperationalError("[Errno 111] Connection refused"), "the broker unavailable"),
        (MessageNacked(), "the broker unavailable"),
        (RuntimeError("a bug"), "relay rounds failing"),
    ],
)
def test_a_relay_waits_out_any_failure_of_a_round_and_says_it_once(
    tq: ToolQueue, fake_redis: Any, caplog: pytest.LogCaptureFixture, exc: Exception, said: str
) -> None:
    import threading

    from tests.helpers import wait_until

    _drain("toolq.calls")
    _submit(tq, fake_redis, "o/1")
    failures = [exc, exc, exc]

    def fail(batch: Any) -> None:
        if failures:
            raise failures.pop()

    relay = _memory_relay(tq, fake_redis, on_read=fail)
    relay.block_ms = 100
    relay.reader._blocking = fake_redis  # type: ignore[attr-defined]  # blocking reads too
    # Shorter waits between tries (0.5 + 1 + 2 s at the defaults): the backoff's steps are
    # Outage's own tests; here, that the relay lives through the failures and says so once
    for waiter in (relay.ledger_wait, relay.broker_wait, relay.fault_wait):
        waiter.outage.first_s, waiter.outage.cap_s = 0.05, 0.2
    caplog.set_level("INFO", logger="toolq.relay")
    runner = threading.Thread(target=relay.run, daemon=True)
    runner.start()
    try:
        # Then the entry is published once the failures stop, by the same run()
        assert wait_until(lambda: not failures and fake_redis.xlen("{toolq}:outbox") == 0, 20)
        assert runner.is_alive()
        assert _drain("toolq.calls") == ["o/1"]
    finally:
        relay.stop()
        runner.join(timeout=10)
        relay.close()
    lines = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert [r.getMessage().split(" (")[0] for r in lines] == [said], lines
    assert (lines[0].exc_info is not None) == isinstance(exc, RuntimeError)  # a bug: traceback
    assert any("back after" in r.getMessage() for r in caplog.records)


def test_a_relay_waiting_for_the_broker_says_so_in_its_beat(tq: ToolQueue, fake_redis: Any) -> None:
    relay = _memory_relay(tq, fake_redis)
    relay.broker_wait.outage.failed(1_700_000_000.0, "OperationalError")
    relay._waiting_beat()
    beat = json.loads(fake_redis.hget("{toolq}:relays", relay.id))
    assert beat["waiting"] == {"for": "broker", "since": 1_700_000_000_000}
    relay.broker_wait.answered()
    relay._last_beat = 0.0
    relay._beat()
    assert "waiting" not in json.loads(fake_redis.hget("{toolq}:relays", relay.id))
