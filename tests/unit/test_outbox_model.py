"""Random interleavings in outbox mode (issue 18): the model of
``test_recovery_model`` with Celery's messages carried by the ledger's outbox and a
relay to a broker whose queue heads cannot be read (the scheduler sees only each
queue's depth, as on RabbitMQ).

The relay is modelled by what it may do to an entry: publish it and delete it,
publish it and die before deleting it (a copy later), or not get to it yet; the
broker may lose a message. Through the real ledger scripts, task bodies and
scheduler on fakeredis with an injected clock, checked after every run:

- never two side effects for one operation_ref;
- once the system is quiet (relays running, every message served), every
  operation is succeeded (with its one side effect), escalated or failed: none
  is left queued behind a message the broker lost (the deadline is out of reach,
  so only a republish can settle it).
"""

from __future__ import annotations

import base64
import json
from collections import deque
from collections.abc import Iterable

import fakeredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from tests.unit.test_recovery_model import FAULTS, Args, Crash, World
from toolq import CallContext, State, ToolQueue
from toolq.core.settings import LeaseSettings, RecoverySettings, ToolqSettings
from toolq.services.scheduler.ages import OutboxAges
from toolq.services.scheduler.service import Scheduler


class Broker:
    """Queues of raw messages, first in first out; only their depth can be read."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[bytes]] = {}

    def q(self, name: str) -> deque[bytes]:
        return self.queues.setdefault(name, deque())

    def read(self, names: Iterable[str]) -> dict[str, int | None]:  # the scheduler's Depths
        return {n: len(self.q(n)) for n in names}

    def close(self) -> None:
        pass


def build(world: World) -> ToolQueue:
    s = ToolqSettings(
        lease=LeaseSettings(seconds=5),
        recovery=RecoverySettings(unclaimed_after=30),
        broker_url=SecretStr("amqp://model//"),  # outbox mode; nothing connects to it
    )
    tq = ToolQueue(redis_url="redis://model/0", settings=s, clock=world.clock)
    tq.app._redis = fakeredis.FakeRedis()

    # A deadline no run reaches: an operation whose message was lost must be published
    # again, not rescued by escalating at its deadline.
    @tq.tool(
        consistency_window=1.0,
        max_attempts=4,
        verify_checks=2,
        verify_backoff=0.5,
        deadline=30 * 86400.0,
    )
    def write(args: Args, ctx: CallContext) -> str:
        fault = world.plan[ctx.operation_ref].pop(0) if world.plan[ctx.operation_ref] else "ok"
        if fault == "crash_before_commit":
            raise Crash()
        if fault == "timeout_before_commit":
            raise TimeoutError("read timed out")
        world.effects[ctx.operation_ref] += 1
        if fault == "crash_after_commit":
            raise Crash()
        if fault == "lost_reply":
            raise ConnectionResetError("reset")
        return "done"

    @write.verifier
    def find(ctx: CallContext) -> str | None:
        if world.verifier_down:
            raise ConnectionError("verifier down")
        return "done" if world.effects[ctx.operation_ref] else None

    return tq


def relay(tq: ToolQueue, broker: Broker, how: str) -> bool:
    """The relay's fate with the oldest outbox entry: ``ok`` publishes and deletes it,
    ``dies`` publishes it and leaves it (another relay publishes it again)."""
    outbox = tq.app.ledger.keys.outbox
    first = tq.redis.xrange(outbox, count=1)
    if not first:
        return False
    entry_id, fields = first[0]
    broker.q(fields[b"queue"].decode()).append(fields[b"message"])
    if how == "ok":
        tq.redis.xdel(outbox, entry_id)
    return True


def deliver(tq: ToolQueue, broker: Broker, queue: str) -> bool:
    q = broker.q(queue)
    if not q:
        return False
    args = json.loads(base64.b64decode(json.loads(q.popleft())["body"]))[0]
    try:
        if queue == tq.settings.queues.calls:
            tq.runtime.run_attempt(args[0], int(args[1]))
        else:
            tq.runtime.run_check(args[0], int(args[1]), int(args[2]))
    except Crash:
        pass
    return True


steps = st.lists(
    st.one_of(
        st.tuples(st.just("relay"), st.sampled_from(["ok", "ok", "dies"])),
        st.tuples(st.just("deliver"), st.sampled_from(["calls", "verify"])),
        st.tuples(st.just("lose"), st.sampled_from(["calls", "verify"])),
        st.tuples(st.just("advance"), st.floats(0.1, 40.0)),
        st.tuples(st.just("verifier"), st.booleans()),
        st.tuples(st.just("tick"), st.just("")),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plans=st.lists(st.lists(st.sampled_from(FAULTS), max_size=3), min_size=1, max_size=4),
    script=steps,
)
def test_no_interleaving_through_the_outbox_makes_two_side_effects(
    plans: list[list[str]], script: list[tuple[str, object]]
) -> None:
    world = World()
    broker = Broker()
    tq = build(world)
    sched = Scheduler(tq.app)
    sched.ages = OutboxAges(tq.app, broker)  # the broker's depths, as Depths reads them
    q = tq.settings.queues
    refs = []
    for i, plan in enumerate(plans):
        ref = f"op/{i}"
        world.plan[ref] = list(plan)
        tq.submit("write", {"n": i}, operation_ref=ref)
        refs.append(ref)
    assert not tq.redis.exists(q.calls)  # outbox mode: nothing pushed to a list

    for action, arg in script:
        if action == "relay":
            relay(tq, broker, str(arg))
        elif action == "deliver":
            deliver(tq, broker, q.calls if arg == "calls" else q.verify)
        elif action == "lose":
            lost = broker.q(q.calls if arg == "calls" else q.verify)
            if lost:
                lost.popleft()
        elif action == "advance":
            world.now += float(arg)  # type: ignore[arg-type]
        elif action == "verifier":
            world.verifier_down = bool(arg)
        else:
            sched.tick()
        assert all(n <= 1 for n in world.effects.values()), world.effects

    # Quiet: the verifier back, a relay that publishes everything, every message served.
    world.verifier_down = False
    for _ in range(600):
        moved = (
            relay(tq, broker, "ok") or deliver(tq, broker, q.calls) or deliver(tq, broker, q.verify)
        )
        if not moved:
            world.now += 60.0
            sched.tick()
            states = {tq.get(r).state for r in refs}  # type: ignore[union-attr]
            if states <= {State.SUCCEEDED, State.ESCALATED, State.FAILED}:
                break
    assert all(n <= 1 for n in world.effects.values()), world.effects
    for ref in refs:
        rec = tq.get(ref)
        assert rec is not None
        assert rec.state in (State.SUCCEEDED, State.ESCALATED, State.FAILED), (ref, rec.state)
        if rec.state is State.SUCCEEDED:
            assert world.effects[ref] == 1
