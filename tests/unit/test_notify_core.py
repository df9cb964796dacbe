"""The sans-I/O cores of the notice subscriptions (Placement) and notifiers (Dispatch):
what each decides, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.adapters.notify.dispatch import Dispatch
from toolq.adapters.notify.format import Event
from toolq.adapters.notify.placement import PLACE_RETRY_S, Placement, as_classic


class FakeSub:
    """What Placement.moved touches of a redis-py PubSub."""

    def __init__(self, *channels: bytes) -> None:
        self.shard_channels: dict[bytes, Any] = {c: None for c in channels}


class Node:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeMap:
    """A cluster client's map: channel -> owner."""

    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners

    def get_node_from_key(self, channel: str) -> Node:
        return Node(self.owners[channel])


def test_new_channels_are_homeless_once_each() -> None:
    p = Placement(["a", "b", "a"])
    assert p.add("b", "c", "c") == ["c"]
    assert p.channels == ["a", "b", "c"] and p.homeless == ["a", "b", "c"]


def test_placed_channels_leave_the_homeless_and_come_back_when_their_node_is_lost() -> None:
    p = Placement(["a", "b", "c"])
    p.placed("n1", ["a", "b"])
    p.placed("n2", ["c"])
    assert p.homeless == [] and not p.due(0.0)
    p.unplace("n1")
    p.lost(now=10.0)
    assert p.homeless == ["a", "b"] and p.where == {"c": "n2"} and p.stale
    assert not p.due(10.0) and p.due(10.0 + PLACE_RETRY_S)
    assert p.deserted("n1") and not p.deserted("n2")


@pytest.mark.parametrize(
    ("homeless", "retry_at", "timeout", "now", "capped", "idle"),
    [
        (False, 0.0, 5.0, 1.0, 5.0, 5.0),  # nothing waits: the whole timeout
        (True, 1.5, 5.0, 1.0, 0.5, 0.5),  # a retry is due sooner: no longer than that
        (True, 9.0, 5.0, 1.0, 5.0, 5.0),  # the retry is later than the timeout
        (True, 0.5, 5.0, 1.0, 0.0, 0.0),  # the retry is overdue: at once
    ],
)
def test_how_long_a_read_or_an_idle_sleep_may_wait(
    homeless: bool, retry_at: float, timeout: float, now: float, capped: float, idle: float
) -> None:
    p = Placement(["a"] if homeless else [])
    p.retry_at = retry_at
    assert p.capped(timeout, now) == capped
    assert p.idle(timeout, now) == idle


def test_a_sunsubscribe_makes_the_channel_homeless_and_reads_as_unsubscribe() -> None:
    p = Placement(["a"])
    p.placed("n1", ["a"])
    sub = FakeSub(b"a")
    msg = p.moved(sub, {"type": "sunsubscribe", "channel": b"a", "data": 0})
    assert msg["type"] == "unsubscribe" and sub.shard_channels == {}
    assert p.homeless == ["a"] and p.stale and p.deserted("n1")


@pytest.mark.parametrize(
    ("kind", "classic"),
    [("smessage", "message"), ("ssubscribe", "subscribe"), ("message", "message")],
)
def test_sharded_kinds_read_as_classic(kind: str, classic: str) -> None:
    assert as_classic({"type": kind})["type"] == classic


def test_channels_go_to_their_owners_on_a_fresh_map() -> None:
    p = Placement(["a", "b", "c"])
    p.stale = True
    assert p.by_owner(FakeMap({"a": "n1", "b": "n2", "c": "n1"})) == {
        "n1": ["a", "c"],
        "n2": ["b"],
    }
    assert not p.stale


def test_an_unreadable_map_is_tried_again_later() -> None:
    p = Placement(["a"])
    err = p.unmapped(OSError("refused"), now=3.0)
    assert "no map of the cluster" in str(err) and p.stale and p.retry_at == 3.0 + PLACE_RETRY_S


class Listener:
    def __init__(self, progress: bool = False) -> None:
        self.progress = progress
        self.heard: list[Event | None] = []

    def put(self, event: Event | None) -> None:
        self.heard.append(event)


def _confirm(d: Dispatch[Listener], channel: str) -> bool:
    group = d.heard({"type": "subscribe", "channel": channel.encode()})
    assert group is not None
    return group.ready


def test_ready_once_every_channel_is_confirmed_and_a_later_confirmation_rereads() -> None:
    d: Dispatch[Listener] = Dispatch(["s0", "s1"], ["p0"])
    waits, watches = Listener(), Listener(progress=True)
    d.add("r", waits)
    d.add("r", watches)
    assert [_confirm(d, "s0"), _confirm(d, "s1"), _confirm(d, "p0")] == [False, True, True]
    assert waits.heard == watches.heard == []
    _confirm(d, "p0")  # the steps channel again: only who hears steps reads again
    assert waits.heard == [] and watches.heard == [None]
    _confirm(d, "s1")  # a settled channel again: everyone reads again
    assert waits.heard == [None] and watches.heard == [None, None]


def test_a_notice_goes_to_its_refs_listeners_only() -> None:
    d: Dispatch[Listener] = Dispatch(["s"])
    mine, other = Listener(), Listener()
    d.add("a/1", mine)
    d.add("b/1", other)
    assert d.heard({"type": "message", "data": b"succeeded a/1\n3 2\n{}"}) is None
    assert [e and (e.ref, e.rev, e.seq) for e in mine.heard] == [("a/1", 3, 2)]
    assert other.heard == []
    d.discard("a/1", mine)
    assert d.count() == 1 and "a/1" not in d.by_ref
