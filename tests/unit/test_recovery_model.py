"""Random interleavings of commits, lost replies, crashes and verifier outages
(issue 5), driven through the real ledger scripts, task bodies and scheduler
on fakeredis with an injected clock. The provider is a model that records
every side effect and does NOT deduplicate: whatever toolq does, it counts.

Invariants checked after every run:
- never two side effects for one operation_ref;
- no attempt starts (the tool is never called) after the operation's deadline;
- once the system is quiet, every operation is in a state that says what is
  known: succeeded (with its one side effect), escalated (unknown outcome,
  verifier down, attempts or deadline used up; its envelope says escalate),
  or failed.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass, field

import fakeredis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from toolq import CallContext, State, ToolQueue
from toolq.core.settings import LeaseSettings, RecoverySettings, ToolqSettings
from toolq.services.scheduler.service import Scheduler


class Crash(BaseException):
    """The worker dies mid-call: nothing after the side effect is recorded."""


FAULTS = ["ok", "lost_reply", "timeout_before_commit", "crash_after_commit", "crash_before_commit"]


@dataclass
class World:
    now: float = 1_000_000.0
    effects: Counter[str] = field(default_factory=Counter)
    #: (ref, time) of every call of the tool, side effect or not
    calls: list[tuple[str, float]] = field(default_factory=list)
    verifier_down: bool = False
    plan: dict[str, list[str]] = field(default_factory=dict)

    def clock(self) -> float:
        return self.now


class Args(BaseModel):
    n: int


def build(world: World, deadline: float = 3600.0) -> ToolQueue:
    s = ToolqSettings(
        lease=LeaseSettings(seconds=5),
        recovery=RecoverySettings(unclaimed_after=30),
    )
    tq = ToolQueue(redis_url="redis://model/0", settings=s, clock=world.clock)
    tq.app._redis = fakeredis.FakeRedis()

    @tq.tool(
        consistency_window=1.0,
        max_attempts=4,
        verify_checks=2,
        verify_backoff=0.5,
        deadline=deadline,
    )
    def write(args: Args, ctx: CallContext) -> str:
        world.calls.append((ctx.operation_ref, world.now))
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


def deliver_one(tq: ToolQueue, queue: str) -> bool:
    raw = tq.redis.rpop(queue)
    if not isinstance(raw, bytes):
        return False
    msg = json.loads(raw)
    args = json.loads(base64.b64decode(msg["body"]))[0]
    try:
        if queue == tq.settings.queues.calls:
            tq.runtime.run_attempt(args[0], int(args[1]))
        else:
            tq.runtime.run_check(args[0], int(args[1]), int(args[2]))
    except Crash:
        pass  # the process is gone; its lease will expire
    return True


steps = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.sampled_from(["calls", "verify"])),
        st.tuples(st.just("advance"), st.floats(0.1, 8.0)),
        st.tuples(st.just("verifier"), st.booleans()),
        st.tuples(st.just("duplicate"), st.integers(0, 4)),
        st.tuples(st.just("tick"), st.just(0)),
    ),
    max_size=60,
)


#: A lost reply while the verifier is down: escalated, outcome unknown (an example
#: of its own below; a generated script of the same plan and length may differ).
VERIFIER_DOWN_SCRIPT = [
    ("verifier", True),
    ("deliver", "calls"),
    ("deliver", "verify"),
    ("advance", 1.0),
    ("tick", 0),
    ("deliver", "verify"),
]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(plans=[["lost_reply"]], script=VERIFIER_DOWN_SCRIPT, deadline=3600.0)
@example(  # crash after commit, a duplicate delivery, then the lease sweep
    plans=[["crash_after_commit"], ["timeout_before_commit", "crash_before_commit"]],
    script=[
        ("deliver", "calls"),
        ("duplicate", 0),
        ("deliver", "calls"),
        ("deliver", "calls"),
        ("advance", 6.0),
        ("tick", 0),
        ("deliver", "verify"),
        ("advance", 2.0),
        ("tick", 0),
        ("deliver", "calls"),
        ("deliver", "verify"),
    ],
    deadline=3600.0,
)
@example(  # a crash after the commit, found only after the deadline: verified, not re-run
    plans=[["crash_after_commit"]],
    script=[("deliver", "calls"), ("advance", 8.0), ("advance", 8.0), ("tick", 0)],
    deadline=12.0,
)
@given(
    plans=st.lists(st.lists(st.sampled_from(FAULTS), max_size=4), min_size=1, max_size=5),
    script=steps,
    # a deadline the script's clock never reaches, and one it often passes mid-recovery
    deadline=st.sampled_from([3600.0, 12.0]),
)
def test_no_interleaving_makes_two_side_effects(
    plans: list[list[str]], script: list[tuple[str, object]], deadline: float
) -> None:
    world = World()
    tq = build(world, deadline)
    submitted_at = world.now
    sched = Scheduler(tq.app)
    refs = []
    for i, plan in enumerate(plans):
        ref = f"op/{i}"
        world.plan[ref] = list(plan)
        tq.submit("write", {"n": i}, operation_ref=ref)
        refs.append(ref)
    q = tq.settings.queues

    for action, arg in script:
        if action == "deliver":
            deliver_one(tq, q.calls if arg == "calls" else q.verify)
        elif action == "advance":
            world.now += float(arg)  # type: ignore[arg-type]
        elif action == "verifier":
            world.verifier_down = bool(arg)
        elif action == "duplicate" and int(arg) < len(refs):  # type: ignore[call-overload]
            ref = refs[int(arg)]  # type: ignore[call-overload]
            attempt = int(tq.ledger.fields(ref, "attempt")["attempt"])
            tq.redis.lpush(*tq.app.messages.run(ref, attempt))
        else:
            sched.tick()
        assert all(n <= 1 for n in world.effects.values()), world.effects

    # Let the system go quiet: the verifier comes back, time passes, everything is served.
    world.verifier_down = False
    for _ in range(200):
        moved = deliver_one(tq, q.calls) or deliver_one(tq, q.verify)
        if not moved:
            world.now += 3.0
            sched.tick()
            if not tq.redis.llen(q.calls) and not tq.redis.llen(q.verify):
                states = {tq.get(r).state for r in refs}  # type: ignore[union-attr]
                if states <= {State.SUCCEEDED, State.ESCALATED, State.FAILED}:
                    break
    assert all(n <= 1 for n in world.effects.values()), world.effects
    assert all(at <= submitted_at + deadline for _, at in world.calls), (deadline, world.calls)
    outcomes = {}
    for ref in refs:
        rec = tq.get(ref)
        assert rec is not None and rec.envelope is not None
        outcomes[ref] = (rec.state, None if rec.envelope.ok else rec.envelope.code)
        if rec.state is State.SUCCEEDED:
            assert world.effects[ref] == 1
        else:
            assert rec.state is State.ESCALATED, rec.state
            env = rec.envelope
            assert not env.ok
            assert env.next_action == "escalate", env.code
            # an escalation says what is known: a write that happened is never
            # reported as not committed
            if world.effects[ref]:
                assert env.commit_state == "unknown", env.code
    if plans == [["lost_reply"]] and script == VERIFIER_DOWN_SCRIPT:
        assert outcomes == {"op/0": (State.ESCALATED, "VERIFICATION_UNAVAILABLE")}
