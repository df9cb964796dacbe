"""The core of a durable call (toolq.adapters.ledger.steps), driven without a server: each
row is the answers a shell would send back, and the effects the core must ask for."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from toolq.adapters.ledger.durability import WAITAOF, Persistence, Plans
from toolq.adapters.ledger.steps import (
    Command,
    Direct,
    Load,
    Probe,
    Send,
    Steps,
    one_server_call,
)
from toolq.core import errors

CALL = ("FCALL", "toolq_claim", 1, "k")
ALWAYS = Persistence(appendonly=True, appendfsync="always")
LOST = redis.exceptions.NoScriptError("NOSCRIPT")


def drive(steps: Steps, answers: list[Any]) -> tuple[list[Any], Any]:
    """The effects asked for and the call's answer, sending ``answers`` in turn."""
    effects: list[Any] = []
    answer: Any = None
    feed = iter(answers)
    while True:
        try:
            effects.append(steps.send(answer))
        except StopIteration as done:
            return effects, done.value
        answer = next(feed)


def plans(mode: str, server: Persistence | None = ALWAYS) -> Plans:
    p = Plans(mode, "test", lambda: 0.0)
    if server is not None:
        p.probed(server)
    return p


@pytest.mark.parametrize(
    ("mode", "server", "answers", "effects", "result"),
    [
        # durability=none: the script alone, as the runner runs it
        ("none", None, [None, "ok"], [Probe(), Direct()], "ok"),
        # AOF off: nothing to wait for (warned), the script alone
        ("fsync", Persistence(appendonly=False), [None, "ok"], [Probe(), Direct()], "ok"),
        # appendfsync always: the call and WAITAOF on one connection, acknowledged
        (
            "fsync",
            ALWAYS,
            [None, list(CALL), ["ok", [1, 0]]],
            [Probe(), Command(), Send([CALL, WAITAOF])],
            "ok",
        ),
        # the server lost the scripts: loaded, the call and its wait sent again
        (
            "fsync",
            ALWAYS,
            [None, list(CALL), [LOST, [1, 0]], None, list(CALL), ["ok", [1, 0]]],
            [Probe(), Command(), Send([CALL, WAITAOF]), Load(), Command(), Send([CALL, WAITAOF])],
            "ok",
        ),
    ],
)
def test_one_server_call(
    mode: str, server: Persistence | None, answers: list[Any], effects: list[Any], result: Any
) -> None:
    assert drive(one_server_call(plans(mode, server)), answers) == (effects, result)


def test_an_unacknowledged_write_is_not_acted_on() -> None:
    steps = one_server_call(plans("fsync"))
    with pytest.raises(errors.NotDurable):
        drive(steps, [None, list(CALL), ["ok", [0, 0]]])


def test_an_error_of_the_call_itself_is_raised() -> None:
    refused = redis.ResponseError("WRONGTYPE")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        drive(one_server_call(plans("fsync")), [None, list(CALL), [refused, [1, 0]]])


def test_a_plan_is_made_once_per_settings_and_again_after_they_change() -> None:
    p = Plans("fsync", "test", lambda: 0.0)
    p.probed(Persistence(appendonly=True, appendfsync="always"))
    first = p.current()
    assert first.wait and p.current() is first  # every durable call asks: made once
    assert p.current(replicas=1).replica and not p.current().replica
    p.learned(redis.ResponseError("ERR unknown command 'WAITAOF'"))  # a server without it
    assert not p.current().wait
    p.probed(Persistence(appendonly=False))
    assert p.current().warning
