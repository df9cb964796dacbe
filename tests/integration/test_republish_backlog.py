"""Behind a backlog the scheduler publishes again only what really left the queue.

Real kombu-format messages in a real queue, no worker: the test plays the
worker's part (taking a message, kombu pushing one back at the front) and
runs the scheduler's ticks itself, with a clock past the unclaimed timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.integration.apps import runtime_app
from toolq import State, ToolQueue
from toolq.adapters.broker.messages import message_ref
from toolq.decisions.recovery.transition import Transition
from toolq.services.scheduler.service import Scheduler

TOOL = "lookup"


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    tq = runtime_app.tq
    tq.configure(redis_url=redis_url)
    yield tq
    tq.close()


def _queued(tq: ToolQueue, ref: str, at_ms: int) -> None:
    """Submit ``ref`` as of ``at_ms``, due for its unclaimed check at once."""
    queue, message = tq.app.messages.run(ref, 1)
    tq.ledger.submit(
        ref=ref,
        tool=TOOL,
        args_json=json.dumps({"mode": ref}),
        fp=ref,
        call_id="",
        now_ms=at_ms,
        max_attempts=3,
        deadline_ms=at_ms + 3_600_000,
        state=State.QUEUED,
        due_ms=at_ms,
        queue=queue,
        message=message,
    )


def _republished(tq: ToolQueue, refs: list[str]) -> dict[str, int]:
    return {ref: int(tq.ledger.fields(ref, "repubs")["repubs"]) for ref in refs}


def test_behind_a_backlog_only_the_lost_message_is_published_again(tq: ToolQueue) -> None:
    calls = tq.settings.queues.calls
    r = tq.redis
    t0 = int(time.time() * 1000) - 60_000
    # Given a backlog, front first: R's message, which kombu pushed back at the front
    # (its worker died); A's first message (A was published again at t0+1000, and its
    # record dates that copy); D; A's second copy; B. And C, whose message was lost
    for ref, at in (("r", t0 - 50), ("a", t0), ("c", t0 + 100), ("d", t0 + 300)):
        _queued(tq, ref, at)
    held = r.rpop(calls)
    assert held is not None and message_ref(held) == "r"
    lost = [m for m in r.lrange(calls, 0, -1) if message_ref(m) == "c"]
    assert len(lost) == 1 and r.lrem(calls, 1, lost[0]) == 1
    again = Transition(
        ref="a",
        states=(State.QUEUED,),
        to=State.QUEUED,
        by="scheduler",
        quiet=True,
        push=tq.app.messages.run("a", 1),
        set={"repubs": "1"},
        due_ms=t0 + 1000,
    )
    assert tq.ledger.apply([again], t0 + 1000) == ["ok"]
    _queued(tq, "b", t0 + 2000)
    msg = json.loads(held)
    msg["headers"]["redelivered"] = True
    r.rpush(calls, json.dumps(msg))
    refs = ["r", "a", "c", "d", "b"]
    clock = [(t0 + 2000 + tq.app.policy.unclaimed_after_ms + 1000) / 1000]
    sched = Scheduler(tq.app, clock=lambda: clock[0])

    # When the scheduler looks
    sched.tick()
    # Then only C is published again: published before D, the first message dated.
    # R's message and A's first copy date nothing (dated by A's record, R, C and D
    # would have been published again) but are seen waiting; A's second copy and B
    # wait behind D. Stopping at A's copy instead held C back until it had left.
    assert _republished(tq, refs) == {"r": 0, "a": 1, "c": 1, "d": 0, "b": 0}

    # When the scheduler looks again, later, with C's new copy at the back
    clock[0] += 2 * tq.app.policy.unclaimed_after_ms / 1000
    sched.tick()
    # Then nothing more: every message is still waiting its turn
    assert _republished(tq, refs) == {"r": 0, "a": 1, "c": 1, "d": 0, "b": 0}
