"""Small builders the contract tests share: records, submits, unchecked transitions."""

from __future__ import annotations

from typing import Any

import redis

from toolq.adapters.ledger import Ledger, SubmitResult
from toolq.core.keys import Keys
from toolq.core.record import HistoryEntry
from toolq.core.states import PENDING_RECOVERY, State
from toolq.decisions.recovery.transition import Transition

NOW = 1_700_000_000_000
LEASE = 30_000
QUEUE = "tq.calls"
TOOL = "send"


def submit(
    ledger: Ledger,
    ref: str,
    *,
    state: State = State.QUEUED,
    tool: str = TOOL,
    fp: str = "fp-1",
    now: int = NOW,
    due: int | None = None,
    queue: str = QUEUE,
    extra: tuple[tuple[str, str], ...] = (),
) -> SubmitResult:
    """Submit as the client does: a queued operation pushes its first message."""
    queued = state is State.QUEUED
    return ledger.submit(
        ref=ref,
        tool=tool,
        args_json='{"to":"x"}',
        fp=fp,
        call_id="call-1",
        now_ms=now,
        max_attempts=3,
        deadline_ms=now + 3_600_000,
        state=state,
        due_ms=now + 60_000 if due is None else due,
        queue=queue if queued else "",
        message=f"run {ref}" if queued else "",
        extra=extra,
    )


def put(ledger: Ledger, ref: str, state: State, *, tool: str = TOOL, **fields: Any) -> None:
    """A record in ``state`` written directly: the walks start from every state."""
    record: dict[str, Any] = {"ref": ref, "tool": tool, "state": str(state), "attempt": 1}
    record.update({"max_attempts": 3, "rev": 1, "vcheck": 0, "vfail": 0, "created": NOW})
    record.update({"entered": NOW, "fp": "fp-1", **fields})
    ledger.redis.hset(ledger.keys.op(ref), mapping=record)


def unchecked(ref: str, states: tuple[State, ...], to: State, *, quiet: bool = False) -> Transition:
    """A transition the Python table did not check: only the script decides."""
    t = Transition(ref=ref, states=states, to=states[0], by="walk", quiet=True)
    t.to, t.quiet = to, quiet  # after __post_init__, which would refuse most of them
    return t


def history(ledger: Ledger, ref: str) -> list[HistoryEntry]:
    """The entries the scripts wrote into the record (``h1`` .. ``h<hn>``), read raw."""
    f = {k.decode(): v for k, v in ledger.redis.hgetall(ledger.keys.op(ref)).items()}
    n = int(f.get("hn") or 0)
    return [HistoryEntry.model_validate_json(f[f"h{i}"]) for i in range(1, n + 1)]


def snapshot(ledger: Ledger) -> dict[bytes, bytes | None]:
    """Every key and its serialised value: to show that a call wrote nothing."""
    return {k: ledger.redis.dump(k) for k in ledger.redis.scan_iter(count=1000)}


def single_tag_ledger(client: redis.Redis) -> tuple[Ledger, list[str]]:
    """Operations in every state: written by the scripts (queued, running) and put
    (every state, with their index and due entries as the scripts keep them)."""
    old = Keys("toolq")
    ledger = Ledger(client, "toolq", "none")
    refs = []
    for i in range(6):
        ref = f"mig/submitted/{i}"
        submit(ledger, ref)
        refs.append(ref)
    for ref in refs[:2]:
        assert ledger.claim(ref, 1, "worker-1", NOW, LEASE).outcome == "claimed"
    for i, state in enumerate(State):
        ref = f"mig/put/{state}"
        put(ledger, ref, state)
        client.zadd(old.index(TOOL, state), {ref: NOW + i})
        if state in PENDING_RECOVERY:
            client.zadd(old.due, {ref: NOW + 1000 + i})
        refs.append(ref)
    client.expire(old.op(refs[-1]), 3600)
    return ledger, refs
