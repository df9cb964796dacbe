"""toolq's kombu transport against a real server: one client object per channel,
and messages still go through (kombu's own behaviour, minus the client churn)."""

from __future__ import annotations

import redis
from kombu import Connection, Exchange, Queue

from toolq.adapters.broker.transport import TRANSPORT


def test_a_channel_reuses_one_client_and_still_carries_messages(redis_url: str) -> None:
    q = Queue("t.calls", Exchange("t.calls", type="direct"), routing_key="t.calls")
    with Connection(redis_url, transport=TRANSPORT) as conn:
        ch = conn.default_channel
        with ch.conn_or_acquire() as first, ch.conn_or_acquire() as second:
            assert first is second
        with conn.Producer() as producer:
            for i in range(3):
                producer.publish({"n": i}, exchange=q.exchange, routing_key="t.calls", declare=[q])
        got = []
        for _ in range(3):
            m = q(ch).get(no_ack=False)
            assert m is not None
            got.append(m.payload["n"])
            m.ack()
        assert got == [0, 1, 2]
        assert q(ch).get() is None


def test_a_channel_closing_after_its_connection_gives_unacked_messages_back(
    redis_url: str,
) -> None:
    # kombu 5.7's own transport fails here with "'NoneType' object has no attribute
    # 'hostname'" (seen after a Redis restart: the worker exits) and leaves the
    # message in the unacked hash until the visibility timeout.
    q = Queue("t.calls", Exchange("t.calls", type="direct"), routing_key="t.calls")
    r = redis.Redis.from_url(redis_url)
    conn = Connection(redis_url, transport=TRANSPORT)
    ch = conn.channel()
    with conn.Producer(channel=ch) as producer:
        producer.publish({"n": 1}, exchange=q.exchange, routing_key="t.calls", declare=[q])
    m = q(ch).get(no_ack=False)
    assert m is not None and r.llen("t.calls") == 0 and r.hlen("unacked") == 1
    ch.connection.client = None  # the connection was torn down first
    ch.close()
    assert r.llen("t.calls") == 1 and r.hlen("unacked") == 0
    r.close()
