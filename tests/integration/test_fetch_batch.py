"""Many messages per fetch (issue 29), against a real server with kombu's own consumer
API: one BRPOP's reply brings up to ``fetch_batch`` messages, each registered in
kombu's ``unacked`` hash and index by the fetch script exactly as kombu's
``QoS.append`` would, so kombu's restores give the same messages back.

Real worker processes: ``test_fetch_batch_worker.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Queue

from toolq.adapters.broker import transport as fetch
from toolq.adapters.broker.transport import TRANSPORT, fetch_more, fetch_supported

QUEUE = Queue("t.calls", Exchange("t.calls", type="direct"), routing_key="t.calls")


@pytest.mark.parametrize(
    ("limit", "room", "more"),
    [
        (64, 5, 4),  # the QoS takes five: the BRPOP's and four more
        (64, 1, 0),  # only the BRPOP's (the script still registers it)
        (64, 0, 0),  # none (kombu polls only when it can take one): never below 0
        (8, 100, 7),  # the option bounds it
        (64, None, 63),  # no prefetch limit: the option alone
        (1, 10, 0),  # one per fetch, registered by the script
        (0, 10, None),  # off: kombu's path
        (0, None, None),
    ],
)
def test_how_many_more_a_fetch_takes(limit: int, room: int | None, more: int | None) -> None:
    assert fetch_more(limit, room) == more


def _publish(conn: Connection, bodies: list[dict[str, Any]], **kwargs: Any) -> None:
    with conn.Producer() as producer:
        for body in bodies:
            producer.publish(
                body, exchange=QUEUE.exchange, routing_key="t.calls", declare=[QUEUE], **kwargs
            )


@contextmanager
def _consuming(conn: Connection, prefetch: int) -> Iterator[tuple[Any, list[Any]]]:
    """A consumer on its own channel with ``prefetch``, and the messages it got."""
    ch = conn.channel()
    got: list[Any] = []
    consumer = Consumer(ch, [QUEUE], callbacks=[lambda body, m: got.append(m)], accept=["json"])
    consumer.qos(prefetch_count=prefetch)
    with consumer:
        yield ch, got


def _entries(r: redis.Redis, unacked: str = "unacked") -> dict[str, Any]:
    return {k.decode(): json.loads(v) for k, v in r.hgetall(unacked).items()}


def test_one_brpop_brings_the_batch_each_registered_as_kombu_would(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"n": i} for i in range(10)])
        with _consuming(conn, prefetch=4) as (ch, got):
            # One event, one BRPOP's reply: the prefetch's four, oldest first
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [0, 1, 2, 3]
            assert r.llen("t.calls") == 6
            # Each as kombu's QoS.append writes it: [the message, exchange, routing key]
            # under its delivery tag, indexed by time
            entries = _entries(r)
            assert set(entries) == {m.delivery_tag for m in got}
            for m in got:
                assert entries[m.delivery_tag] == [m._raw, "t.calls", "t.calls"]
            assert {t.decode() for t in r.zrange("unacked_index", 0, -1)} == set(entries)
            # kombu's local bookkeeping has them all (nothing left as only registered)
            assert set(ch.qos._delivered) == set(entries) and not ch.qos.toolq_registered
            # The QoS is full: nothing more until an ack
            assert not ch.qos.can_consume()
            got[0].ack()
            assert r.hlen("unacked") == 3 and r.zcard("unacked_index") == 3
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [0, 1, 2, 3, 4]
            for m in got[1:]:
                m.ack()
        assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
    r.close()


def test_what_the_script_wrote_kombus_restore_gives_back_whole(redis_url: str) -> None:
    # Given a batch taken and registered by the fetch script, never acknowledged
    r = redis.Redis.from_url(redis_url)
    bodies = [
        {"n": i, "text": 'é \u2028 / \\ " ', "big": 2**60 + i, "f": 0.1 + i} for i in range(5)
    ]
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, bodies)
        sent = [json.loads(x) for x in reversed(r.lrange("t.calls", 0, -1))]
        with _consuming(conn, prefetch=10) as (ch, got):
            conn.drain_events(timeout=5)
            assert len(got) == 5 and r.llen("t.calls") == 0 and r.hlen("unacked") == 5
            # When kombu restores them as a dead worker's (visibility timeout passed:
            # another process's channel, its restore_visible)
            with Connection(redis_url, transport=TRANSPORT) as other:
                other.default_channel.qos.visibility_timeout = -1  # all past it
                other.default_channel.qos.restore_visible(num=100, interval=1)
            # Then the list holds the same messages (kombu marks them redelivered)
            assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
            back = [json.loads(x) for x in r.lrange("t.calls", 0, -1)]
            assert len(back) == 5
            for b in back:
                assert b["headers"].pop("redelivered") is True
                assert b["properties"]["delivery_info"].pop("redelivered") is True
            by_tag = {m["properties"]["delivery_tag"]: m for m in sent}
            assert {b["properties"]["delivery_tag"]: b for b in back} == by_tag
            # and they decode to the bodies sent
            ch.qos._delivered.clear()  # forgotten here: the worker "died"
        with _consuming(conn, prefetch=10) as (_, again):
            conn.drain_events(timeout=5)
            assert sorted(m.payload["n"] for m in again) == list(range(5))
            assert [m.payload for m in sorted(again, key=lambda m: m.payload["n"])] == bodies
            for m in again:
                m.ack()
    r.close()


def test_a_closing_channel_gives_its_batch_back(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"n": i} for i in range(6)])
        with _consuming(conn, prefetch=4) as (ch, got):
            conn.drain_events(timeout=5)
            assert len(got) == 4 and r.hlen("unacked") == 4
            ch.close()  # kombu's restore_unacked: by tag, from the hash
        assert r.hlen("unacked") == 0 and r.llen("t.calls") == 6
    r.close()


def test_with_priorities_a_batch_comes_from_the_brpops_list_and_goes_back_to_it(
    redis_url: str,
) -> None:
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        # kombu's sub-list for priority 9 (on Redis 0 comes first: the plain list)
        _publish(conn, [{"n": i} for i in range(3)], priority=9)
        _publish(conn, [{"n": 10 + i} for i in range(3)])
        low = "t.calls\x06\x169"
        assert r.llen(low) == 3 and r.llen("t.calls") == 3
        with _consuming(conn, prefetch=10) as (ch, got):
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [10, 11, 12]  # that list only
            assert r.llen(low) == 3 and r.llen("t.calls") == 0
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [10, 11, 12, 0, 1, 2]
            assert r.llen(low) == 0 and r.hlen("unacked") == 6
            ch.close()
        # each back to the list of its priority
        assert r.llen(low) == 3 and r.llen("t.calls") == 3
        assert {json.loads(x)["properties"]["priority"] for x in r.lrange(low, 0, -1)} == {9}
    r.close()


def test_under_a_global_key_prefix(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    opts = {"global_keyprefix": "pfx:"}
    with Connection(redis_url, transport=TRANSPORT, transport_options=opts) as conn:
        _publish(conn, [{"n": i} for i in range(6)])
        assert r.llen("pfx:t.calls") == 6
        with _consuming(conn, prefetch=4) as (ch, got):
            conn.drain_events(timeout=5)  # a BRPOP and the script
            assert [m.payload["n"] for m in got] == [0, 1, 2, 3] and ch._toolq_backlog
            assert r.hlen("pfx:unacked") == 4 and r.zcard("pfx:unacked_index") == 4
            for m in got:
                m.ack()
            conn.drain_events(timeout=5)  # the script alone
            assert [m.payload["n"] for m in got[4:]] == [4, 5]
            assert r.hlen("pfx:unacked") == 2 and r.zcard("pfx:unacked_index") == 2
            assert not r.exists("unacked", "unacked_index", "t.calls", "pfx:pfx:t.calls")
            ch.close()
        assert r.llen("pfx:t.calls") == 2 and r.hlen("pfx:unacked") == 0
    r.close()


def test_a_refused_script_falls_back_to_kombus_path(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: Any) -> Any:
        raise redis.ResponseError("NOPERM this user has no permissions to run 'evalsha'")

    monkeypatch.setattr(fetch, "_evalsha", refused)
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"n": i} for i in range(3)])
        with _consuming(conn, prefetch=10) as (ch, got):
            conn.drain_events(timeout=5)
            # One message, registered by kombu's QoS.append; the rest left in the list
            assert [m.payload["n"] for m in got] == [0]
            assert r.llen("t.calls") == 2 and list(_entries(r)) == [got[0].delivery_tag]
            assert ch._toolq_refused_until > 0
            conn.drain_events(timeout=5)  # kombu's path again for a while
            assert [m.payload["n"] for m in got] == [0, 1] and r.hlen("unacked") == 2
            ch.close()
        assert r.llen("t.calls") == 3
    r.close()


def test_fetch_batch_zero_is_kombus_path(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    opts = {"fetch_batch": 0}
    with Connection(redis_url, transport=TRANSPORT, transport_options=opts) as conn:
        _publish(conn, [{"n": i} for i in range(3)])
        with _consuming(conn, prefetch=10) as (ch, got):
            assert ch.fetch_batch == 0
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [0] and r.hlen("unacked") == 1
            ch.close()
    r.close()


@pytest.mark.parametrize(
    ("version", "supported"),
    [((5, 7, 0), True), ((5, 7, 3), True), ((5, 8, 0), False), ((5, 6, 9), False), ((6, 0), False)],
)
def test_the_fetch_replaces_kombus_read_only_on_the_series_it_follows(
    version: tuple[int, ...], supported: bool
) -> None:
    assert fetch_supported(version) is supported


def test_under_another_kombu_each_fetch_is_kombus_own_read(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fetch, "FETCH_HERE", False)
    monkeypatch.setattr(fetch, "_said_unsupported", False)
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"n": i} for i in range(3)])
        with _consuming(conn, prefetch=10) as (ch, got):
            conn.drain_events(timeout=5)
            conn.drain_events(timeout=5)
            # one message a BRPOP, each registered by kombu's QoS.append
            assert [m.payload["n"] for m in got] == [0, 1] and r.hlen("unacked") == 2
            assert r.llen("t.calls") == 1 and not ch.qos.toolq_registered
            ch.close()
        assert r.llen("t.calls") == 3  # the closing channel gave its two back
    r.close()
    said = [rec for rec in caplog.records if "many-messages fetch" in rec.getMessage()]
    assert len(said) == 1  # said once, not per fetch


def test_a_message_the_script_cannot_read_stops_the_batch_and_stays_in_the_list(
    redis_url: str,
) -> None:
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"n": 0}, {"n": 1}])
        r.lpush("t.calls", b"not json")  # behind them
        _publish(conn, [{"n": 2}])
        with _consuming(conn, prefetch=10) as (ch, got):
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [0, 1]
            assert r.lrange("t.calls", 0, -1)[-1] == b"not json"  # next for kombu's BRPOP
            assert r.hlen("unacked") == 2
            ch.close()
        assert r.llen("t.calls") == 4
    r.close()


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_while_the_list_holds_more_a_fetch_is_the_script_alone_in_priority_order(
    redis_url: str,
) -> None:
    r = redis.Redis.from_url(redis_url)
    low = "t.calls\x06\x169"
    with Connection(redis_url, transport=TRANSPORT) as conn:
        # Given four messages of priority 9, and a consumer that takes two at a time
        _publish(conn, [{"n": i} for i in range(4)], priority=9)
        with _consuming(conn, prefetch=2) as (ch, got):
            brpops = _calls(r, "brpop")
            conn.drain_events(timeout=5)  # a BRPOP, then the script: two
            assert [m.payload["n"] for m in got] == [0, 1] and r.llen(low) == 2
            assert _calls(r, "brpop") == brpops + 1 and ch._toolq_backlog
            # When two messages of a higher priority arrive, and a slot frees
            _publish(conn, [{"n": 10}, {"n": 11}])
            got[0].ack()
            got[1].ack()
            conn.drain_events(timeout=5)
            # Then the next fetch is the script alone (no BRPOP), and like a BRPOP it
            # takes from the list of the highest priority first
            assert [m.payload["n"] for m in got[2:]] == [10, 11]
            assert _calls(r, "brpop") == brpops + 1
            assert set(_entries(r)) == {m.delivery_tag for m in got[2:]}
            assert not ch._toolq_backlog  # it emptied that list
            for m in got[2:]:
                m.ack()
            conn.drain_events(timeout=5)  # a BRPOP again: the low list
            assert [m.payload["n"] for m in got[4:]] == [2, 3]
            assert _calls(r, "brpop") == brpops + 2
            ch.close()
        assert r.llen(low) == 2 and r.hlen("unacked") == 0
    r.close()


def test_a_script_unknown_to_the_server_is_loaded_again_through_a_brpop(
    redis_url: str,
) -> None:
    r = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"n": i} for i in range(6)])
        with _consuming(conn, prefetch=2) as (ch, got):
            conn.drain_events(timeout=5)
            assert len(got) == 2 and ch._toolq_backlog
            r.script_flush()  # a restart, a failover: the server forgot it
            for m in got:
                m.ack()
            # The script alone: NOSCRIPT, nothing taken; then a BRPOP, whose fetch
            # loads the script again: all within one drain
            conn.drain_events(timeout=5)
            assert [m.payload["n"] for m in got] == [0, 1, 2, 3]
            assert r.llen("t.calls") == 2 and r.hlen("unacked") == 2
            assert r.script_exists(fetch._FETCH_SHA) == [True]
            ch.close()
        assert r.llen("t.calls") == 4
    r.close()


def test_the_sentinel_channel_keeps_kombus_sentinel_options_beside_fetch_batch() -> None:
    from kombu.transport.redis import SentinelChannel as KombuSentinel

    from toolq.adapters.broker.transport import SentinelChannel

    assert set(KombuSentinel.from_transport_options) < set(SentinelChannel.from_transport_options)
    assert "fetch_batch" in SentinelChannel.from_transport_options


def test_two_queues_each_message_reaches_its_own_queues_consumer_once(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    other = Queue("t.verify", Exchange("t.verify", type="direct"), routing_key="t.verify")
    with Connection(redis_url, transport=TRANSPORT) as conn:
        _publish(conn, [{"q": "calls", "n": i} for i in range(5)])
        with conn.Producer() as producer:
            for i in range(5):
                producer.publish(
                    {"q": "verify", "n": i},
                    exchange=other.exchange,
                    routing_key="t.verify",
                    declare=[other],
                )
        ch = conn.channel()
        got: dict[str, list[Any]] = {"calls": [], "verify": []}
        calls = Consumer(ch, [QUEUE], callbacks=[lambda b, m: got["calls"].append(m)])
        verify = Consumer(ch, [other], callbacks=[lambda b, m: got["verify"].append(m)])
        calls.qos(prefetch_count=2)
        scripts = _calls(r, "evalsha") + _calls(r, "eval")
        with calls, verify:
            for _ in range(20):
                if len(got["calls"]) + len(got["verify"]) == 10:
                    break
                conn.drain_events(timeout=5)
                for m in got["calls"] + got["verify"]:
                    if not m.acknowledged:
                        m.ack()
        # Each message to its own queue's consumer, once, in order; nothing left
        for q in ("calls", "verify"):
            assert [(m.payload["q"], m.payload["n"]) for m in got[q]] == [(q, i) for i in range(5)]
        assert r.llen("t.calls") == 0 and r.llen("t.verify") == 0 and r.hlen("unacked") == 0
        assert _calls(r, "evalsha") + _calls(r, "eval") > scripts  # through the fetch script
        ch.close()
    r.close()


@pytest.mark.parametrize("backlog", [False, True], ids=["brpop", "script-alone"])
def test_a_fetch_read_after_its_consumer_was_cancelled_goes_back_whole_in_one_line(
    redis_url: str, caplog: pytest.LogCaptureFixture, backlog: bool
) -> None:
    r = redis.Redis.from_url(redis_url)
    with (
        Connection(redis_url, transport=TRANSPORT) as conn,
        Connection(redis_url, transport=TRANSPORT) as other,
    ):
        ch = conn.channel()
        got: list[Any] = []
        consumer = Consumer(ch, [QUEUE], callbacks=[lambda body, m: got.append(m)], accept=["json"])
        consumer.qos(prefetch_count=3)
        consumer.consume()
        first = 0
        if backlog:  # the last fetch left messages: the next one is the script alone
            _publish(other, [{"n": i} for i in range(6)])
            conn.drain_events(timeout=5)
            assert len(got) == 3 and ch._toolq_backlog
            for m in got:
                m.ack()
            first = 3

        else:
            _publish(other, [{"n": i} for i in range(3)])

        # Given a fetch out (a BRPOP, or the script alone) when the consumer is cancelled,
        # as Celery's consumer is when it reconnects
        conn.transport.cycle._register_BRPOP(ch)
        assert ch._in_poll
        consumer.cancel()

        # When the old channel reads its reply
        with caplog.at_level(logging.INFO):
            ch._brpop_read()

        # Then none is delivered or left registered, it is said once in toolq's words
        # (kombu said "Requeuing undeliverable message ...: No consumers" for each), and
        # they are back at the queue's head, in their order
        assert len(got) == (3 if backlog else 0)
        assert r.hlen("unacked") == 0 and r.llen("t.calls") == 3
        said = [rec.getMessage() for rec in caplog.records]
        assert not [x for x in said if "undeliverable" in x], said
        n = 3 if backlog else 1  # the script's batch, or the BRPOP's one (no more taken)
        assert said == [
            f"{n} message(s) of t.calls fetched as the consumer reconnected went back to the queue"
        ]
        with _consuming(other, prefetch=3) as (_, again):
            other.drain_events(timeout=5)
            assert [m.payload["n"] for m in again] == [first, first + 1, first + 2]
            for m in again:
                m.ack()
    r.close()
