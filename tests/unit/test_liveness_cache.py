"""Who is serving, without a worker: the warnings as a table, the read-rarely cache,
the beat, and how ``toolq status`` shows each queue. Real workers beating and a
submit's warnings are in tests/integration/test_liveness.py.
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
import redis

from toolq.adapters.liveness import ALIVE_MS, CHECK_EVERY_S, Heartbeat, Liveness, assess
from toolq.core.keys import Keys
from toolq.edges.cli.monitor import render_status
from toolq.edges.monitor import shape

NOW = 1_800_000_000_000
Q = "toolq.calls"
KEYS = Keys()
NO_WORKER = f"no live worker for queue {Q}"
NO_SCHEDULER = "no live scheduler"


@pytest.mark.parametrize(
    ("worker", "schedulers", "expected"),
    [
        (NOW - 1_000, [NOW - 2_000], ()),
        (NOW - ALIVE_MS, [NOW - ALIVE_MS], ()),  # the edge still counts
        (None, [NOW], (NO_WORKER,)),  # never seen
        (NOW - ALIVE_MS - 1, [NOW], (NO_WORKER,)),  # three beats missed
        (NOW, [], (NO_SCHEDULER,)),
        (NOW, [NOW - ALIVE_MS - 1, NOW - 60_000], (NO_SCHEDULER,)),
        (NOW, [NOW - 60_000, NOW - 1], ()),  # one live scheduler is enough
        (None, [], (NO_WORKER, NO_SCHEDULER)),
    ],
)
def test_assess(worker: int | None, schedulers: list[int], expected: tuple[str, ...]) -> None:
    found = assess(Q, worker, schedulers, NOW)
    assert len(found) == len(expected)
    for said, start in zip(found, expected, strict=True):
        assert said.startswith(start), said


class Clock:
    def __init__(self) -> None:
        self.t = NOW / 1000

    def __call__(self) -> float:
        return self.t


def test_beats_missed_during_an_outage_of_the_server_are_not_a_dead_worker() -> None:
    # Given a worker and a scheduler beating until the server went away at NOW
    clock = Clock()
    lv = Liveness(KEYS.workers, KEYS.schedulers, clock=clock)
    beats = ({Q: str(NOW - 2_000)}, [str(NOW - 1_000)])
    # When this process's calls fail for two minutes (the outage), then the server is
    # back and the first read finds the beats as they were when it went away
    for t in range(0, 120, 5):
        clock.t = NOW / 1000 + t
        lv.away()
    clock.t = NOW / 1000 + 121
    lv.update(*beats)
    # Then nothing is said: they were live when the server went away
    assert lv.warnings(Q) == ()
    # And once ALIVE_MS has passed since the last failure without a beat, it is said
    clock.t += ALIVE_MS / 1000
    lv.update(*beats)
    said = lv.warnings(Q)
    assert [w.split(" (")[0].split(":")[0] for w in said] == [NO_WORKER, NO_SCHEDULER]


def test_an_outage_judges_only_beats_live_when_it_began() -> None:
    # a worker dead a minute before the server went away is still no live worker
    clock = Clock()
    lv = Liveness(KEYS.workers, KEYS.schedulers, clock=clock)
    for _ in range(7):  # failing every 5 s for 30 s: one outage, from NOW
        lv.away()
        clock.t += 5
    lv.update({Q: str(NOW - 60_000)}, [str(NOW - 1_000)])
    assert [w[: len(NO_WORKER)] for w in lv.warnings(Q)] == [NO_WORKER]


def test_a_failed_read_of_the_beats_is_an_outage_too() -> None:
    clock = Clock()
    lv = Liveness(KEYS.workers, KEYS.schedulers, clock=clock)
    down = redis.Redis(port=1, socket_connect_timeout=0.5)  # nothing listens on port 1
    assert lv.check(down, Q) == ()  # the read failed at NOW: nothing read, nothing said
    clock.t += 12
    # read 12 s later: beats from 5 s before the failure are 17 s old now, but were
    # live when the server went away
    lv.update({Q: str(NOW - 5_000)}, [str(NOW - 5_000)])
    assert lv.warnings(Q) == ()
    clock.t += ALIVE_MS / 1000  # long past the failure: judged now
    assert len(lv.warnings(Q)) == 2


class Counting(fakeredis.FakeRedis):
    """Counts pipelines sent: each is one round trip."""

    sent = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        Counting.sent += 1
        return super().pipeline(*args, **kwargs)


def test_submits_read_the_beats_at_most_every_few_seconds() -> None:
    # Given a process with its cache and a server where nothing serves yet
    clock = Clock()
    client = Counting()
    Counting.sent = 0
    lv = Liveness(KEYS.workers, KEYS.schedulers, clock=clock)
    # When many submits ask within the check period
    first = [lv.check(client, Q) for _ in range(50)]
    # Then one round trip answered them all, and all warn
    assert Counting.sent == 1
    assert all(w and w[0].startswith(NO_WORKER) for w in first)
    # When a worker and a scheduler beat, the cache says so only once it is read again
    client.hset(KEYS.workers, Q, int(clock() * 1000))
    client.hset(KEYS.schedulers, "s1", int(clock() * 1000))
    assert lv.check(client, Q)[0].startswith(NO_WORKER)
    clock.t += CHECK_EVERY_S
    assert lv.check(client, Q) == ()
    assert Counting.sent == 2
    # And a worker that stops beating is missed once its beat is old enough
    clock.t += ALIVE_MS / 1000 + 0.001
    assert lv.check(client, Q)[0].startswith(NO_WORKER)
    assert lv.check(client, "toolq.other")[0].startswith("no live worker for queue toolq.other")


def test_a_failed_read_never_fails_the_submit() -> None:
    class Refusing(fakeredis.FakeRedis):
        def pipeline(self, *args: Any, **kwargs: Any) -> Any:
            raise redis.ConnectionError("down")

    lv = Liveness(KEYS.workers, KEYS.schedulers, clock=Clock())
    assert lv.check(Refusing(), Q) == ()  # nothing known: no warning, no error


def test_a_warning_is_logged_once_until_it_clears(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    client = fakeredis.FakeRedis()
    client.hset(KEYS.schedulers, "s1", NOW)
    lv = Liveness(KEYS.workers, KEYS.schedulers, clock=clock, every=0)
    with caplog.at_level("WARNING", logger="toolq.liveness"):
        for _ in range(3):
            lv.check(client, Q)
        client.hset(KEYS.workers, Q, NOW)
        assert lv.check(client, Q) == ()
        client.hdel(KEYS.workers, Q)
        lv.check(client, Q)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all(s.startswith(NO_WORKER) for s in said), said


def test_a_beat_names_every_queue_the_worker_consumes() -> None:
    client = fakeredis.FakeRedis()
    clock = Clock()
    Heartbeat(lambda: client, KEYS.workers, [Q, "toolq.verify"], clock=clock).beat()
    assert client.hgetall(KEYS.workers) == {Q.encode(): b"%d" % NOW, b"toolq.verify": b"%d" % NOW}


def test_status_shows_each_queues_last_beat() -> None:
    snap = shape(
        now_ms=NOW,
        prefix="toolq",
        tools={},
        stats={},
        queues={Q: 0, "toolq.verify": 0},
        unacked=0,
        due=(0, 0, None),
        schedulers={"s1": NOW},
        worker_beats={Q: NOW - 3_000, "toolq.verify": NOW - 60_000, "toolq.extra": NOW},
    )
    workers = snap["queues"]["workers"]
    assert workers[Q] == {"last_beat_ms": NOW - 3_000, "age_s": 3.0, "alive": True}
    assert workers["toolq.verify"]["alive"] is False
    assert workers["toolq.extra"]["alive"] is True  # a queue a worker serves, beyond the two
    text = render_status(snap)
    line = next(x for x in text.splitlines() if x.startswith("heartbeats"))
    assert f"{Q} 3s ago" in line
    assert "toolq.verify no live worker (last 1m00s ago)" in line


def test_status_of_a_server_no_worker_ever_served() -> None:
    snap = shape(
        now_ms=NOW,
        prefix="toolq",
        tools={},
        stats={},
        queues={Q: 4},
        unacked=0,
        due=(0, 0, None),
        schedulers={},
    )
    assert f"{Q} no live worker (never seen)" in render_status(snap)


def test_a_worker_silent_for_an_hour_is_forgotten_by_its_field() -> None:
    """Entries are ``node#pid``: removing by node name alone removed nothing."""
    from toolq.adapters.liveness import FORGET_NODE_MS, WorkerNode

    r = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    keys = Keys()
    now_ms = 1_800_000_000_000
    old = WorkerNode("calls-1@host", 7, "solo", 1, ("q",), 0, now_ms - FORGET_NODE_MS - 1)
    recent = WorkerNode("calls-1@host", 8, "solo", 1, ("q",), 0, now_ms - 60_000)
    r.hset(keys.worker_nodes, mapping={n.field: n.to_json() for n in (old, recent)})
    beat = Heartbeat(
        lambda: r, keys.workers, ["q"], clock=lambda: now_ms / 1000, nodes_key=keys.worker_nodes
    )

    beat.forget_silent()

    assert [f.decode() for f in r.hkeys(keys.worker_nodes)] == [recent.field]


@pytest.mark.parametrize(
    ("beat_s", "alive_s", "ok"),
    [(5.0, 15.0, True), (0.2, 1.0, True), (0.5, 1.0, True), (5.0, 9.0, False), (1.0, 0.5, False)],
)
def test_staleness_is_at_least_two_beats(beat_s: float, alive_s: float, ok: bool) -> None:
    from pydantic import ValidationError

    from toolq.core.settings import WorkerSettings

    if ok:
        assert WorkerSettings(beat_s=beat_s, alive_s=alive_s).alive_s == alive_s
    else:
        with pytest.raises(ValidationError, match="at least two beats"):
            WorkerSettings(beat_s=beat_s, alive_s=alive_s)


def test_a_client_call_that_finds_the_server_away_tells_the_liveness_cache() -> None:
    # the sync and the async client's submits, against a port where nothing listens
    import asyncio

    from toolq import ToolQueue
    from toolq.core.errors import ServerUnavailable

    tq = ToolQueue(redis_url="redis://127.0.0.1:1/0", name="liveness-away")

    @tq.tool(writes=False)
    def noop() -> dict[str, Any]:
        return {}

    try:
        clock = Clock()
        tq.app.liveness.clock = clock
        with pytest.raises(ServerUnavailable):
            tq.submit("noop", {})
        assert tq.app.liveness._away_since == clock()
        clock.t += 60
        with pytest.raises(ServerUnavailable):
            asyncio.run(tq.aio.submit("noop", {}))
        assert tq.app.liveness._away_since == clock()  # a new outage: 60 s apart
    finally:
        tq.close()
