"""Waiting for a wake-up (toolq.topology.listen) and the scheduler's per-mode parts
(toolq.services.scheduler.share, toolq.services.scheduler.ages): which class each topology
picks, as a table, and the notice-driven classes on a scripted subscription. The real waits run
in tests/integration/test_scheduler.py, test_outbox.py and tests/integration/cluster/."""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any

import fakeredis
import pytest
from pydantic import SecretStr

from toolq.adapters.ledger import Ledger
from toolq.core.keys import Keys
from toolq.core.settings import ToolqSettings
from toolq.services.scheduler.ages import ListHeads, OutboxAges, ages_for
from toolq.services.scheduler.share import LeasedCells, OneTag, share_for
from toolq.topology import topology_for
from toolq.topology.listen import (
    BlockingOutboxes,
    NoticeOutboxes,
    Notices,
    NoticeWake,
    WakeLists,
    outbox_reader,
    wake_listener,
)

URL = "redis://127.0.0.1:1/0"
BROKER = SecretStr("redis://127.0.0.1:1/1")


def _settings(**mode: Any) -> ToolqSettings:
    return ToolqSettings(redis_url=SecretStr(URL), **mode)


MODES = [
    # (mode, wake listener, outbox reader, share, queue ages)
    ({}, WakeLists, BlockingOutboxes, OneTag, ListHeads),
    ({"cells": 4}, WakeLists, BlockingOutboxes, LeasedCells, ListHeads),
    ({"broker_url": BROKER}, WakeLists, BlockingOutboxes, OneTag, OutboxAges),
    ({"cells": 4, "broker_url": BROKER}, WakeLists, BlockingOutboxes, LeasedCells, OutboxAges),
    (
        {"cluster": True, "cells": 4, "broker_url": BROKER},
        NoticeWake,
        NoticeOutboxes,
        LeasedCells,
        OutboxAges,
    ),
]


@pytest.mark.parametrize(("mode", "wake", "reader", "share", "ages"), MODES)
def test_each_topology_picks_its_classes_once(
    mode: dict[str, Any], wake: type, reader: type, share: type, ages: type
) -> None:
    settings = _settings(**mode)
    topology = topology_for(settings)
    client: Any = fakeredis.FakeRedis()
    stop = threading.Event()
    listener = wake_listener(topology, stop, client=client, redis_url=URL, max_sleep=1.0)
    assert type(listener) is wake
    outboxes = outbox_reader(topology, client=client, redis_url=URL, consumer="r1")
    assert type(outboxes) is reader
    assert outboxes.streams == topology.layout.outbox_streams()
    ledger = Ledger(client, settings.prefix, "none", cells=settings.cells)
    assert type(share_for(topology.layout, ledger, "s1", 1000, lambda: 0)) is share

    class App:
        redis = client

        def __init__(self) -> None:
            self.settings = settings
            self.ledger = ledger

    found = ages_for(topology, App())
    assert type(found) is ages
    found.close()


class Scripted:
    """A subscription that answers the messages it was given, then None."""

    def __init__(self, channels: list[str], messages: list[dict[str, Any]]) -> None:
        self.channels = channels
        self.messages = deque(messages)
        self.timeouts: list[float] = []
        self.closed = False

    def get_message(self, timeout: float) -> dict[str, Any] | None:
        self.timeouts.append(timeout)
        return self.messages.popleft() if self.messages else None

    def close(self) -> None:
        self.closed = True


def _msg(kind: str, channel: str) -> dict[str, Any]:
    return {"type": kind, "channel": channel.encode(), "data": b"x"}


def test_notices_follow_their_channels_and_say_which_were_heard() -> None:
    made: list[Scripted] = []
    queued = [
        _msg("subscribe", "a"),
        _msg("message", "a"),
        _msg("unsubscribe", "b"),  # its slot moved: what it announced meanwhile is gone
    ]

    def subscribe(channels: list[str]) -> Scripted:
        made.append(Scripted(channels, queued if not made else []))
        return made[-1]

    notices = Notices(subscribe)
    assert notices.collect(1.0) == set()  # nothing followed yet: nothing heard
    assert notices.follow(["a", "b"]) is True
    assert notices.follow(["a", "b"]) is False  # the same channels: the same subscription
    # the first message waited for, every one already there taken at once
    assert notices.collect(0.5) == {"a", "b"}
    assert made[0].timeouts == [0.5, 0.0, 0.0, 0.0]
    assert notices.follow(["c"]) is True  # other channels: subscribed afresh
    assert made[0].closed and made[1].channels == ["c"]
    notices.drop()
    assert made[1].closed and notices.channels == []


def test_a_notice_wake_returns_on_a_notice_of_a_cell_it_walks() -> None:
    cells = [Keys("toolq", 0), Keys("toolq", 1)]
    made: list[Scripted] = []

    def subscribe(channels: list[str]) -> Scripted:
        made.append(Scripted(channels, [_msg("message", cells[1].notify)]))
        return made[-1]

    stop = threading.Event()
    wake = NoticeWake(stop, subscribe)
    wake.wait(30.0, cells)  # returns on the notice, not after 30 s
    assert made[0].channels == [k for c in cells for k in (c.notify, c.notify_steps)]
    wake.wait(0.0, [])  # no cell held: no subscription kept
    assert made[0].closed


def test_a_cluster_relay_reads_the_outboxes_it_heard_of_and_all_now_and_then() -> None:
    cells = [Keys("toolq", c) for c in range(3)]
    made: list[Scripted] = []

    def subscribe(channels: list[str]) -> Scripted:
        made.append(Scripted(channels, []))
        return made[-1]

    reader = NoticeOutboxes(fakeredis.FakeRedis(), cells, "r1", subscribe)
    # Given a fresh subscription: every outbox is read once (what came before is unheard)
    assert reader._to_read() == [k.outbox for k in cells]
    reader._full_read = math.inf  # the next full read not due within this test
    # When a notice of cell 2 arrives: only its outbox is read until the next full read
    made[0].messages.append(_msg("message", cells[2].notify_steps))
    assert reader._to_read() == [cells[2].outbox]
    assert reader._to_read() == []
