"""The ledger in Redis: operation records, history, indexes, and transitions.

Every write is one Lua script call (:mod:`toolq.ledger.scripts`); which
transition to ask for is decided by pure code (:mod:`toolq.states`,
:mod:`toolq.recovery.outcome`, :mod:`toolq.recovery.policy`). The transition
table is checked twice from one source: when a :class:`Transition` is built,
and by the scripts, into which it is rendered. Every key a script touches is
passed to it in KEYS, named by :class:`toolq.keys.Keys`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.connection import Connection

from toolq import errors
from toolq.envelope import ToolError, ToolSuccess
from toolq.keys import Keys
from toolq.ledger import scripts
from toolq.ledger.durability import Durability
from toolq.record import HistoryEntry, OperationRecord, load_envelope
from toolq.recovery.transition import Transition
from toolq.states import State

#: APPLY's arguments before the blobs: notify channel, now, items.
APPLY_FIXED_ARGS = 3


@dataclass(frozen=True)
class SubmitResult:
    outcome: str  # created | exists | conflict
    state: State


@dataclass(frozen=True)
class Claim:
    """What a claim returns: the operation's inputs, or why it may not run."""

    outcome: str  # claimed | held | stale | missing
    tool: str = ""
    args: str = ""
    call_id: str = ""
    fp: str = ""
    approved_fp: str = ""
    vcheck: int = 0
    max_attempts: int = 0
    deadline_ms: int = 0
    uncertain_at_ms: int = 0
    vfail: int = 0
    created_ms: int = 0
    attempt: int = 0
    holder: str = ""
    lease_until_ms: int = 0
    state: str = ""


def to_wire(
    t: Transition, blobs: list[str], queues: dict[str, int], first_queue: int
) -> dict[str, Any]:
    """The script's view of this transition. Long strings (the envelope, the
    Celery message) go to ``blobs``, passed as script arguments of their own,
    and the item names their ARGV index: JSON inside JSON would be escaped
    here and unescaped by the script, the largest cost of a batch. A queue it
    pushes to goes to ``queues`` (name -> KEYS index, from ``first_queue`` on):
    the script declares every key it writes."""
    item: dict[str, Any] = {
        "ref": t.ref,
        "states": [str(s) for s in t.states],
        "to": str(t.to),
        "by": t.by,
    }
    if t.code:
        item["code"] = t.code
    if t.expect:
        item["expect"] = t.expect
    if t.attempt_incr:
        item["attempt_incr"] = t.attempt_incr
    if t.set:
        item["set"] = t.set
    if t.delete:
        item["del"] = list(t.delete)
    if t.envelope is not None:
        blobs.append(t.envelope.model_dump_json(exclude_none=True))
        item["envelope"] = APPLY_FIXED_ARGS + len(blobs)
    if t.remove_due:
        item["due"] = -1
    elif t.due_ms is not None:
        item["due"] = t.due_ms
    if t.push is not None:
        queue, message = t.push
        blobs.append(message)
        index = queues.setdefault(queue, first_queue + len(queues))
        item["push"] = [index, APPLY_FIXED_ARGS + len(blobs)]
    if t.stats:
        item["stats"] = list(t.stats)
    if t.ttl is not None:
        item["ttl"] = t.ttl
    if t.quiet:
        item["quiet"] = True
    return item


class Calls:
    """The KEYS and ARGV of the script calls clients make (submit, apply): built here
    once for the sync :class:`Ledger` and the async one
    (:class:`toolq.ledger.aio.AsyncLedger`), which differ only in how they send them.
    The worker's and the scheduler's calls are the sync Ledger's own."""

    def __init__(self, prefix: str = "toolq") -> None:
        self.keys = Keys(prefix)
        self.fixed = scripts.fixed_keys(self.keys)
        self.notify = self.keys.notify

    def submit(
        self,
        *,
        ref: str,
        tool: str,
        args_json: str,
        fp: str,
        call_id: str,
        now_ms: int,
        max_attempts: int,
        deadline_ms: int,
        state: State,
        due_ms: int,
        queue: str,
        message: str,
    ) -> tuple[list[str], list[Any]]:
        keys = [*self.fixed, self.keys.op(ref), self.keys.history(ref)]
        if message:
            keys.append(queue)
        args = [self.notify, ref, tool, args_json, fp, call_id, now_ms, max_attempts]
        return keys, [*args, deadline_ms, str(state), due_ms, message]

    def apply(self, transitions: Sequence[Transition], now_ms: int) -> tuple[list[str], list[Any]]:
        """APPLY's KEYS (fixed, op and history per item, the queues) and ARGV."""
        keys = list(self.fixed)
        for t in transitions:
            keys.append(self.keys.op(t.ref))
            keys.append(self.keys.history(t.ref))
        blobs: list[str] = []
        queues: dict[str, int] = {}
        first_queue = len(keys) + 1  # KEYS is 1-based
        items = [to_wire(t, blobs, queues, first_queue) for t in transitions]
        keys.extend(queues)  # in index order: dicts keep insertion order
        return keys, [self.notify, now_ms, json.dumps(items, separators=(",", ":")), *blobs]


class Ledger:
    """Operation records in Redis. One instance per process; thread-safe."""

    def __init__(
        self, client: redis.Redis, prefix: str = "toolq", durability: str = "none"
    ) -> None:
        self.redis = client
        #: Submits and claims of runs are on disk before they are answered
        #: (``ToolqSettings.durability``, :mod:`toolq.ledger.durability`).
        self.durable = Durability(client, durability)
        self.calls = Calls(prefix)
        self.keys = self.calls.keys
        self._submit = client.register_script(scripts.SUBMIT)
        self._claim = client.register_script(scripts.CLAIM)
        self._renew = client.register_script(scripts.RENEW)
        self._apply = client.register_script(scripts.APPLY)
        self._claim_due = client.register_script(scripts.CLAIM_DUE)
        self._plan_sleep = client.register_script(scripts.PLAN_SLEEP)

    # ------------------------------------------------------------------ writes

    def submit(self, **operation: Any) -> SubmitResult:
        """Create an operation (the fields of :class:`toolq.calls.NewOperation`)."""
        keys, args = self.calls.submit(**operation)
        return submit_result(self.durable.call(self._submit, keys, args))

    def claim(
        self,
        ref: str,
        attempt: int,
        holder: str,
        now_ms: int,
        lease_ms: int,
        kind: str = "run",
        vcheck: int = 0,
    ) -> Claim:
        keys = [*self.calls.fixed, self.keys.op(ref), self.keys.history(ref)]
        args: list[Any] = [self.calls.notify, ref, attempt, holder, now_ms, lease_ms, kind, vcheck]
        if kind == "run":  # a claim a power loss undid would run the tool again
            return claim_result(self.durable.call(self._claim, keys, args))
        return claim_result(self._claim(keys=keys, args=args))

    def renew(
        self, now_ms: int, lease_ms: int, held: Sequence[tuple[str, int, str, str]]
    ) -> list[str]:
        """Extend leases given as (ref, attempt, kind, holder); returns the refs no longer held."""
        if not held:
            return []
        keys = list(self.calls.fixed)
        args: list[Any] = [self.calls.notify, now_ms, lease_ms]
        for ref, attempt, kind, holder in held:
            keys.append(self.keys.op(ref))
            args.extend((ref, attempt, kind, holder))
        return strs(self._renew(keys=keys, args=args))

    def apply(self, transitions: Sequence[Transition], now_ms: int) -> list[str]:
        """Apply transitions atomically, one script call; ``"ok"`` or the state that refused."""
        if not transitions:
            return []
        keys, args = self.calls.apply(transitions, now_ms)
        return strs(self._apply(keys=keys, args=args))

    def apply_one(self, transition: Transition, now_ms: int) -> str:
        return self.apply([transition], now_ms)[0]

    def claim_due(self, now_ms: int, limit: int, hold_ms: int) -> list[dict[str, str]]:
        keys, args = self._claim_due_call(now_ms, limit, hold_ms)
        return _due_rows(self._claim_due(keys=keys, args=args))

    def _claim_due_call(self, now_ms: int, limit: int, hold_ms: int) -> tuple[list[str], list[Any]]:
        return [*self.calls.fixed, self.keys.op_prefix], [self.calls.notify, now_ms, limit, hold_ms]

    # The same two calls split into send and read, for a caller that keeps them in
    # flight on connections of its own (the scheduler's drain). The scripts must be
    # loaded (load_scripts); a server that lost them answers NOSCRIPT (ResponseError).

    def load_scripts(self) -> None:
        for script in (self._apply, self._claim_due):
            script.sha = self.redis.script_load(script.script)

    def send_apply(self, conn: Connection, transitions: Sequence[Transition], now_ms: int) -> None:
        keys, args = self.calls.apply(transitions, now_ms)
        _send_evalsha(conn, self._apply.sha, keys, args)

    def read_apply(self, conn: Connection) -> list[str]:
        return strs(conn.read_response())

    def send_claim_due(self, conn: Connection, now_ms: int, limit: int, hold_ms: int) -> None:
        keys, args = self._claim_due_call(now_ms, limit, hold_ms)
        _send_evalsha(conn, self._claim_due.sha, keys, args)

    def read_claim_due(self, conn: Connection) -> list[dict[str, str]]:
        return _due_rows(conn.read_response())

    def plan_sleep(self, now_ms: int, max_ms: int) -> int:
        """Record when the scheduler will wake (the earliest due item, at most max_ms away)."""
        args: list[Any] = [self.calls.notify, now_ms, max_ms]
        return int(float(self._plan_sleep(keys=self.calls.fixed, args=args)))

    # ------------------------------------------------------------------ reads

    def get(self, ref: str, *, with_history: bool = True) -> OperationRecord | None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.op(ref))
        if with_history:
            pipe.lrange(self.keys.history(ref), 0, -1)
        res = pipe.execute()
        return record_of(res[0], res[1] if with_history else None)

    def fields(self, ref: str, *names: str) -> dict[str, str]:
        return fields_of(names, self.redis.hmget(self.keys.op(ref), list(names)))

    def history(self, ref: str, after: int = 0) -> list[HistoryEntry]:
        """The history entries after the first ``after``; OperationNotFound for no operation."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(self.keys.history(ref), history_start(after), -1)
        pipe.exists(self.keys.op(ref))
        entries, exists = pipe.execute()
        return history_of(ref, entries, exists)

    def envelope(self, ref: str) -> ToolSuccess | ToolError | None:
        raw = self.redis.hget(self.keys.op(ref), "envelope")
        return None if raw is None else load_envelope(raw)

    def stats(self) -> dict[str, int]:
        return {_s(k): int(v) for k, v in self.redis.hgetall(self.keys.stats).items()}

    def tools(self) -> list[str]:
        return sorted(_s(t) for t in self.redis.smembers(self.keys.tools))


# --------------------------------------------------------------------------- replies, read once


def submit_result(out: Any) -> SubmitResult:
    return SubmitResult(_s(out[0]), State(_s(out[1])))


def claim_result(raw: Any) -> Claim:
    out = strs(raw)
    outcome = out[0]
    if outcome == "claimed":
        return Claim(
            outcome,
            tool=out[1],
            args=out[2],
            call_id=out[3],
            fp=out[4],
            approved_fp=out[5],
            vcheck=int(out[6] or 0),
            max_attempts=int(out[7] or 0),
            deadline_ms=int(out[8] or 0),
            uncertain_at_ms=int(float(out[9] or 0)),
            vfail=int(out[10] or 0),
            created_ms=int(out[11] or 0),
            attempt=int(out[12] or 0),
        )
    if outcome == "held":
        return Claim(
            outcome,
            holder=out[1],
            lease_until_ms=int(float(out[2] or 0)),
            tool=out[3] if len(out) > 3 else "",
            vcheck=int(out[4]) if len(out) > 4 else 0,
            max_attempts=int(out[5]) if len(out) > 5 else 0,
            call_id=out[6] if len(out) > 6 else "",
        )
    if outcome == "stale":
        return Claim(outcome, state=out[1])
    return Claim(outcome)


def record_of(raw: dict[bytes, bytes], history: list[bytes] | None) -> OperationRecord | None:
    if not raw:
        return None
    fields = {_s(k): _s(v) for k, v in raw.items()}
    entries = [HistoryEntry.model_validate_json(h) for h in history or ()]
    return OperationRecord.from_fields(fields, entries)


def fields_of(names: Sequence[str], values: Sequence[Any]) -> dict[str, str]:
    return {n: _s(v) for n, v in zip(names, values, strict=True) if v is not None}


def history_start(after: int) -> int:
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise errors.InvalidArguments("after must be a whole number >= 0")
    return after


def history_of(ref: str, entries: list[bytes], exists: int) -> list[HistoryEntry]:
    # An operation always has its first entry: none at all and no record means no operation.
    if not entries and not exists:
        raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
    return [HistoryEntry.model_validate_json(h) for h in entries]


def strs(raw: Any) -> list[str]:
    return [_s(x) for x in raw]


def _send_evalsha(conn: Connection, sha: str, keys: list[str], args: list[Any]) -> None:
    conn.send_command("EVALSHA", sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]


def _due_rows(raw: Any) -> list[dict[str, str]]:
    names = ("ref", "due_score", *scripts.DUE_FIELDS)
    # cjson writes every field as a string, except a score it may write as a number
    return [dict(zip(names, map(str, row), strict=True)) for row in json.loads(raw)]


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
