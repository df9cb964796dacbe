"""The ledger in Redis: operation records, history, indexes, and transitions.

Every write is one Lua script call (:mod:`toolq.ledger.scripts`); which
transition to ask for is decided by pure code (:mod:`toolq.states`,
:mod:`toolq.recovery.outcome`, :mod:`toolq.recovery.policy`). The transition
table is checked twice from one source: when a :class:`Transition` is built,
and by the scripts, into which it is rendered. Every key a script touches is
passed to it in KEYS, named by :class:`toolq.keys.Keys`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.connection import Connection

from toolq import errors
from toolq.cells import cell_of, cells_conflict, lease_plan
from toolq.envelope import ToolError, ToolSuccess
from toolq.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, Keys
from toolq.ledger import scripts
from toolq.ledger.durability import Durability, lost_scripts
from toolq.record import HistoryEntry, OperationRecord, load_envelope
from toolq.recovery.transition import Transition
from toolq.states import State

#: The keys a call that acknowledges a Celery delivery also writes (kombu's, untagged:
#: only on the server that is the broker too, as the Celery queue lists SUBMIT pushes to).
UNACKED_KEYS = (KOMBU_UNACKED, KOMBU_UNACKED_INDEX)


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
    t: Transition,
    out: list[Any],
    blobs: list[str],
    queues: dict[str, int],
    first_queue: int,
    outbox: Outbox | None = None,
) -> None:
    """Append the script's view of this transition to ``out``, APPLY's flat item
    (:data:`toolq.ledger.scripts.ITEM_HEAD`, then its counted lists). Long strings
    (the envelope, the Celery message) go to ``blobs``, passed as script arguments
    of their own, and the item names their number: JSON inside JSON would be
    escaped here and unescaped by the script. A queue it pushes to goes to
    ``queues`` (name -> KEYS index, from ``first_queue`` on): the script declares
    every key it writes. In outbox mode the key is the outbox, and the queue's
    name a blob (one per queue, in ``outbox.names``)."""
    envelope = push_queue = push_message = push_name = 0
    if t.envelope is not None:
        blobs.append(t.envelope.model_dump_json(exclude_none=True))
        envelope = len(blobs)
    if t.push is not None:
        queue, message = t.push
        blobs.append(message)
        push_message = len(blobs)
        if outbox is not None:
            push_name = outbox.names.get(queue, 0)
            if not push_name:
                blobs.append(queue)
                push_name = outbox.names[queue] = len(blobs)
            queue = outbox.key
        push_queue = queues.setdefault(queue, first_queue + len(queues))
    due: int | bool = -1 if t.remove_due else (False if t.due_ms is None else t.due_ms)
    ttl: int | bool = False if t.ttl is None else t.ttl
    out += (t.ref, t.to, t.by, t.code or False, t.quiet, t.attempt_incr, envelope, due)
    out += (push_queue, push_message, push_name, ttl, len(t.states), *t.states)
    # Values as strings: the script compares them with what HMGET answers (a string,
    # which a JSON number never equals in Lua) and HSET refuses a JSON true or null.
    out.append(sum(len(fields) for fields in t.expect.values()))
    for which, fields in t.expect.items():
        for name, value in fields.items():
            out += (which, name, str(value))
    out.append(len(t.set))
    for name, value in t.set.items():
        out += (name, str(value))
    out += (len(t.delete), *t.delete, len(t.stats), *t.stats)


@dataclass
class Outbox:
    """Outbox mode, for one APPLY call being built: the stream's key, and the blob
    number of each queue name already passed."""

    key: str
    names: dict[str, int]


def functions_refused(exc: redis.ResponseError) -> bool:
    """FUNCTION LOAD's error on a server that has no functions (or will not let us load)."""
    text = str(exc).lower()
    return "unknown command" in text or "unknown subcommand" in text or "noperm" in text


class ScriptWay:
    """How one client runs the ledger's scripts, what :class:`Scripts` and
    :class:`toolq.ledger.aio.AsyncScripts` share: ``FCALL`` of the library where
    the server has functions, else ``EVALSHA`` of each script (no I/O here)."""

    def __init__(self) -> None:
        #: None until the first load says whether the server has functions.
        self.functions: bool | None = None

    def raw(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The command that runs script ``name``, once loaded (:attr:`functions` known)."""
        if self.functions:
            return ["FCALL", scripts.function_name(name), len(keys), *keys, *args]
        return ["EVALSHA", self.sha(name), len(keys), *keys, *args]

    def sha(self, name: str) -> str:
        raise NotImplementedError

    def refused(self, exc: redis.ResponseError) -> None:
        """What a FUNCTION LOAD that failed says: the library is there already (another
        process loaded it), or the server has no functions; anything else is raised."""
        if "already exists" in str(exc):
            self.functions = True
        elif functions_refused(exc):
            self.functions = False
        else:
            raise exc


class Scripts(ScriptWay):
    """Runs the ledger's scripts on one client (:class:`ScriptWay`). Loads what it
    needs on first use, and again when the server lost it (a restart without
    persistence, a flush). Thread-safe: loading twice is harmless."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        self._evals: dict[str, Script] = {}

    def __call__(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self.functions is None:
            self.load()
        if not self.functions:
            return self._eval(name)(keys=keys, args=args)
        fn = scripts.function_name(name)
        try:
            return self.client.fcall(fn, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            if not lost_scripts(exc):
                raise
        self.load()
        return self.client.fcall(fn, len(keys), *keys, *args)

    def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """The raw command that runs script ``name`` (for a pipeline or a connection)."""
        if self.functions is None:
            self.load()
        return self.raw(name, keys, args)

    def load(self) -> None:
        """Load the library (or, without functions, every script) into the server.

        On a Cluster, into every primary (redis-py sends FUNCTION LOAD and SCRIPT
        LOAD to all of them); with REPLACE there, because FUNCTION LOAD stops at the
        first primary that answers "already exists", and a primary that lacks the
        library (a node added empty) would never get it. The library's name is a
        hash of its code, so replacing it replaces it with itself. A replica has
        what its primary loaded (functions replicate): a failover loses nothing.
        """
        if self.functions is not False:
            try:
                self.client.function_load(scripts.library(), replace=self.cluster)
                self.functions = True
            except redis.ResponseError as exc:
                self.refused(exc)
        if not self.functions:
            for name in scripts.NAMES:
                script = self._eval(name)
                script.sha = self.client.script_load(script.script)

    def sha(self, name: str) -> str:
        return str(self._eval(name).sha)

    def _eval(self, name: str) -> Script:
        script = self._evals.get(name)
        if script is None:
            script = self._evals[name] = self.client.register_script(scripts.script(name))
        return script


class Calls:
    """The KEYS and ARGV of the script calls clients make (submit, apply): built here
    once for the sync :class:`Ledger` and the async one
    (:class:`toolq.ledger.aio.AsyncLedger`), which differ only in how they send them.
    The worker's and the scheduler's calls are the sync Ledger's own."""

    def __init__(
        self,
        prefix: str = "toolq",
        outbox: bool = False,
        cell: int | None = None,
        cells: int | None = None,
    ) -> None:
        self.keys = Keys(prefix, cell)
        self.fixed = scripts.fixed_keys(self.keys)
        self.notify = self.keys.notify
        #: Outbox mode (``ToolqSettings.outbox``): messages go to :attr:`Keys.outbox`.
        self.outbox = outbox
        #: Cells mode (``ToolqSettings.cells``): every call by ref goes to :meth:`of` it.
        self.cells = cells
        self._cells: dict[int, Calls] = {}

    def of(self, ref: str) -> Calls:
        """The calls on ``ref``'s keys: its cell's (:func:`toolq.cells.cell_of`) in
        cells mode, else these."""
        if self.cells is None:
            return self
        return self.cell(cell_of(ref, self.cells))

    def cell(self, cell: int) -> Calls:
        """The calls on the keys of ``cell`` (made once)."""
        found = self._cells.get(cell)
        if found is None:
            found = Calls(self.keys.prefix, self.outbox, cell, self.cells)
            found._cells = self._cells  # one cache for every cell's calls
            self._cells[cell] = found
        return found

    def by_cell(self, refs: Sequence[str]) -> dict[Calls, list[int]]:
        """The positions of ``refs`` grouped by the calls of their cell, in order (one
        script touches one cell: a call on several cells is one call per cell)."""
        groups: dict[Calls, list[int]] = {}
        for i, ref in enumerate(refs):
            groups.setdefault(self.of(ref), []).append(i)
        return groups

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
        keys = [*self.fixed, self.keys.op(ref)]
        args = [self.notify, ref, tool, args_json, fp, call_id, now_ms, max_attempts]
        args += (deadline_ms, str(state), due_ms, message)
        if message and self.outbox:
            keys.append(self.keys.outbox)
            args.append(queue)
        elif message:
            keys.append(queue)
        return keys, args

    def apply(
        self, transitions: Sequence[Transition], now_ms: int, ack: str | None = None
    ) -> tuple[list[str], list[Any]]:
        """APPLY's KEYS (fixed, the op of each item, the queues[, kombu's unacked
        keys]) and ARGV; ``ack``: the Celery delivery tag the call acknowledges."""
        keys = list(self.fixed)
        keys.extend(self.keys.op(t.ref) for t in transitions)
        blobs: list[str] = []
        queues: dict[str, int] = {}
        first_queue = len(keys) + 1  # KEYS is 1-based
        items: list[Any] = [len(transitions)]
        outbox = Outbox(self.keys.outbox, {}) if self.outbox else None
        for t in transitions:
            to_wire(t, items, blobs, queues, first_queue, outbox)
        keys.extend(queues)  # in index order: dicts keep insertion order
        if ack:
            items.append(ack)
            keys.extend(UNACKED_KEYS)
        return keys, [self.notify, now_ms, json.dumps(items, separators=(",", ":")), *blobs]


class Ledger:
    """Operation records in Redis. One instance per process; thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "toolq",
        durability: str = "none",
        *,
        outbox: bool = False,
        cell: int | None = None,
        cells: int | None = None,
    ) -> None:
        self.redis = client
        #: Submits and claims of runs are on disk before they are answered
        #: (``ToolqSettings.durability``, :mod:`toolq.ledger.durability`).
        self.durable = Durability(client, durability)
        #: In cells mode (``cells``) every call by ref goes to the ref's cell; the
        #: ledger's own :attr:`keys` are then the deployment-wide ones (schedulers,
        #: workers, meta: no cell), and the per-cell keys (due, wake, stats, tools,
        #: indexes, outbox) are each cell's (:meth:`in_cell`).
        self.calls = Calls(prefix, outbox, cell, cells)
        self.keys = self.calls.keys
        self.cells = cells
        self.scripts = Scripts(client)
        #: :meth:`record_cells` ran: the number of cells (or none) is the ledger's.
        self.cells_checked = False

    def in_cell(self, cell: int) -> Ledger:
        """This ledger's calls on the keys of ``cell`` (:mod:`toolq.cells`): the same
        client, durability and loaded scripts, so a process needs one Ledger per
        cell it touches and loads the library once."""
        other = copy.copy(self)
        other.calls = self.calls.cell(cell)
        other.keys = other.calls.keys
        return other

    def every_cell(self) -> list[Ledger]:
        """:meth:`in_cell` of every cell in cells mode; else this ledger alone."""
        if self.cells is None:
            return [self]
        return [self.in_cell(cell) for cell in range(self.cells)]

    def keys_of(self, ref: str) -> Keys:
        """The keys of ``ref``'s cell (this ledger's own without cells)."""
        return self.calls.of(ref).keys

    def record_cells(self) -> None:
        """Cells mode: record the number of cells in the deployment's meta at first use,
        and refuse (errors.RequestRefused) a ledger recorded with another number. On the
        single tag: refuse a ledger that was moved into cells (``toolq cells migrate``)."""
        meta = Keys(self.keys.prefix).meta
        if self.cells is None:
            recorded = self.redis.hget(meta, "cells")
        else:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hsetnx(meta, "cells", self.cells)
            pipe.hget(meta, "cells")
            recorded = pipe.execute()[1]
        why = cells_conflict(recorded, self.cells)
        if why is not None:
            raise errors.RequestRefused(why)
        self.cells_checked = True

    # ------------------------------------------------------------------ writes

    def submit(self, **operation: Any) -> SubmitResult:
        """Create an operation (the fields of :class:`toolq.calls.NewOperation`).
        The first one checks the number of cells (:meth:`record_cells`) if nothing
        did yet: an operation written on the wrong layout is one no process reads."""
        if not self.cells_checked:
            self.record_cells()
        keys, args = self.calls.of(operation["ref"]).submit(**operation)
        return submit_result(self.durable.call(self.scripts, "submit", keys, args))

    def claim(
        self,
        ref: str,
        attempt: int,
        holder: str,
        now_ms: int,
        lease_ms: int,
        kind: str = "run",
        vcheck: int = 0,
        ack: str | None = None,
    ) -> Claim:
        """Claim an attempt or a check; with ``ack`` (a Celery delivery tag), an answer
        other than claimed acknowledges the delivery in the same step."""
        calls = self.calls.of(ref)
        keys = [*calls.fixed, calls.keys.op(ref)]
        args: list[Any] = [calls.notify, ref, attempt, holder, now_ms, lease_ms, kind, vcheck]
        if ack:
            keys.extend(UNACKED_KEYS)
            args.append(ack)
        if kind == "run":  # a claim a power loss undid would run the tool again
            return claim_result(self.durable.call(self.scripts, "claim", keys, args))
        return claim_result(self.scripts("claim", keys, args))

    def renew(
        self, now_ms: int, lease_ms: int, held: Sequence[tuple[str, int, str, str]]
    ) -> list[str]:
        """Extend leases given as (ref, attempt, kind, holder); returns the refs no longer held."""
        if not held:
            return []
        if self.cells is not None:  # one call per cell
            groups = self.calls.by_cell([h[0] for h in held])
            return [
                ref
                for g in groups.values()
                for ref in self._renew(now_ms, lease_ms, [held[i] for i in g])
            ]
        return self._renew(now_ms, lease_ms, held)

    def _renew(
        self, now_ms: int, lease_ms: int, held: Sequence[tuple[str, int, str, str]]
    ) -> list[str]:
        calls = self.calls.of(held[0][0])
        keys = list(calls.fixed)
        args: list[Any] = [calls.notify, now_ms, lease_ms]
        for ref, attempt, kind, holder in held:
            keys.append(calls.keys.op(ref))
            args.extend((ref, attempt, kind, holder))
        return strs(self.scripts("renew", keys, args))

    def apply(
        self, transitions: Sequence[Transition], now_ms: int, ack: str | None = None
    ) -> list[str]:
        """Apply transitions atomically, one script call; ``"ok"`` or the state that refused.

        ``ack``: the Celery delivery tag this call ends, acknowledged in the same step
        (kombu's Redis transport on the ledger's server; see :func:`toolq.broker.transport`).
        """
        if not transitions:
            return []
        if self.cells is None:
            keys, args = self.calls.apply(transitions, now_ms, ack)
            return strs(self.scripts("apply", keys, args))
        groups = self.calls.by_cell([t.ref for t in transitions])
        results = [""] * len(transitions)
        for calls, where in groups.items():  # one call per cell, answers put back in order
            keys, args = calls.apply([transitions[i] for i in where], now_ms, ack)
            ack = None  # acknowledged once
            for i, res in zip(where, strs(self.scripts("apply", keys, args)), strict=True):
                results[i] = res
        return results

    def apply_one(self, transition: Transition, now_ms: int, ack: str | None = None) -> str:
        return self.apply([transition], now_ms, ack)[0]

    def ack(self, delivery: str) -> None:
        """Acknowledge a Celery delivery that ends without a ledger call (what kombu's
        Redis transport sends on ack; see ``ack`` in :meth:`claim` and :meth:`apply`)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(KOMBU_UNACKED, delivery)
        pipe.zrem(KOMBU_UNACKED_INDEX, delivery)
        pipe.execute()

    def claim_due(self, now_ms: int, limit: int, hold_ms: int) -> list[dict[str, str]]:
        keys, args = self._claim_due_call(now_ms, limit, hold_ms)
        return _due_rows(self.scripts("claim_due", keys, args))

    def _claim_due_call(self, now_ms: int, limit: int, hold_ms: int) -> tuple[list[str], list[Any]]:
        return [*self.calls.fixed, self.keys.op_prefix], [self.calls.notify, now_ms, limit, hold_ms]

    # Cells mode: the scheduler's two calls on every cell, pipelined (a ClusterPipeline
    # sends each node its cells' calls together).

    def claim_due_cells(
        self, cells: Sequence[int], now_ms: int, limit: int, hold_ms: int
    ) -> list[list[dict[str, str]]]:
        """:meth:`claim_due` in each of ``cells``, in that order."""
        calls = [self.in_cell(c)._claim_due_call(now_ms, limit, hold_ms) for c in cells]
        return [_due_rows(raw) for raw in self._on_cells("claim_due", calls)]

    def plan_sleep_cells(self, cells: Sequence[int], now_ms: int, max_ms: int) -> int:
        """:meth:`plan_sleep` in each of ``cells``: the earliest wake-up over them."""
        calls = []
        for c in cells:
            cell = self.calls.cell(c)
            calls.append((cell.fixed, [cell.notify, now_ms, max_ms]))
        return min(int(float(raw)) for raw in self._on_cells("plan_sleep", calls))

    def hold_cells(
        self, holder: str, held: Sequence[int], ttl_ms: int, schedulers: int
    ) -> list[int]:
        """Cells mode: the cells scheduler ``holder`` holds now, its fair share of them
        (:func:`toolq.cells.lease_plan` among ``schedulers`` live ones). Renews the
        leases of ``held`` it keeps (for ``ttl_ms``), gives up the rest, and takes free
        or expired ones while below its share. At most three round trips."""
        cells = self._cells()
        release, _ = lease_plan(list(held), len(cells), schedulers)
        gone = set(release)
        keep = [c for c in held if c not in gone]
        calls = [self._lease_call(c, holder, ttl_ms, "hold") for c in keep]
        calls += [self._lease_call(c, holder, ttl_ms, "release") for c in release]
        answers = self._on_cells("cell_lease", calls) if calls else []
        now_held = [c for c, held_now in zip(keep, answers, strict=False) if int(held_now)]
        _, want = lease_plan(now_held, len(cells), schedulers)
        if want > 0:
            pipe = self.redis.pipeline(transaction=False)
            mine = set(now_held)
            others = [c for c in cells if c not in mine]
            for c in others:
                pipe.get(self.calls.cell(c).keys.cell_lease)
            free = [c for c, who in zip(others, pipe.execute(), strict=True) if who is None][:want]
            if free:
                taking = [self._lease_call(c, holder, ttl_ms, "hold") for c in free]
                answers = self._on_cells("cell_lease", taking)
                now_held += [c for c, took in zip(free, answers, strict=True) if int(took)]
        return sorted(now_held)

    def release_cells(self, holder: str, held: Sequence[int]) -> None:
        """Give up the leases of ``held`` (a scheduler stopping: others take over at once)."""
        if held:
            self._on_cells("cell_lease", [self._lease_call(c, holder, 0, "release") for c in held])

    def _lease_call(
        self, cell: int, holder: str, ttl_ms: int, mode: str
    ) -> tuple[list[str], list[Any]]:
        calls = self.calls.cell(cell)
        return [*calls.fixed, calls.keys.cell_lease], [calls.notify, holder, ttl_ms, mode]

    def _cells(self) -> range:
        if self.cells is None:
            raise ValueError("not in cells mode")
        return range(self.cells)

    def _on_cells(
        self, name: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """Script ``name`` once per (keys, args), in one pipeline; loaded again and the
        whole pipeline sent again when the server lost the scripts (what a first
        CLAIM_DUE held then comes back after its hold: later, never lost)."""
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=False)
            for keys, args in calls:
                pipe.execute_command(*self.scripts.command(name, keys, args))  # type: ignore[no-untyped-call]
            try:
                return list(pipe.execute())
            except redis.ResponseError as exc:
                if attempt == 2 or not lost_scripts(exc):
                    raise
                self.scripts.load()
        raise AssertionError("unreachable")

    # The same two calls split into send and read, for a caller that keeps them in
    # flight on connections of its own (the scheduler's drain). The scripts must be
    # loaded (load_scripts); a server that lost them answers NOSCRIPT (NoScriptError).

    def load_scripts(self) -> None:
        self.scripts.load()

    def send_apply(self, conn: Connection, transitions: Sequence[Transition], now_ms: int) -> None:
        keys, args = self.calls.apply(transitions, now_ms)
        conn.send_command(*self.scripts.command("apply", keys, args))  # type: ignore[no-untyped-call]

    def read_apply(self, conn: Connection) -> list[str]:
        return strs(_read_script_reply(conn))

    def send_claim_due(self, conn: Connection, now_ms: int, limit: int, hold_ms: int) -> None:
        keys, args = self._claim_due_call(now_ms, limit, hold_ms)
        conn.send_command(*self.scripts.command("claim_due", keys, args))  # type: ignore[no-untyped-call]

    def read_claim_due(self, conn: Connection) -> list[dict[str, str]]:
        return _due_rows(_read_script_reply(conn))

    def plan_sleep(self, now_ms: int, max_ms: int) -> int:
        """Record when the scheduler will wake (the earliest due item, at most max_ms away)."""
        args: list[Any] = [self.calls.notify, now_ms, max_ms]
        return int(float(self.scripts("plan_sleep", self.calls.fixed, args)))

    # ------------------------------------------------------------------ reads

    def get(self, ref: str, *, with_history: bool = True) -> OperationRecord | None:
        return record_of(self.redis.hgetall(self.keys_of(ref).op(ref)), with_history)

    def fields(self, ref: str, *names: str) -> dict[str, str]:
        return fields_of(names, self.redis.hmget(self.keys_of(ref).op(ref), list(names)))

    def history(self, ref: str, after: int = 0) -> list[HistoryEntry]:
        """The history entries after the first ``after``; OperationNotFound for no operation."""
        start = history_start(after)
        return history_of(ref, self.redis.hgetall(self.keys_of(ref).op(ref)), start)

    def envelope(self, ref: str) -> ToolSuccess | ToolError | None:
        raw = self.redis.hget(self.keys_of(ref).op(ref), "envelope")
        return None if raw is None else load_envelope(raw)

    def stats(self) -> dict[str, int]:
        """The counters (:attr:`Keys.stats`); in cells mode summed over every cell."""
        if self.cells is None:
            return {_s(k): int(v) for k, v in self.redis.hgetall(self.keys.stats).items()}
        pipe = self.redis.pipeline(transaction=False)
        for cell in range(self.cells):
            pipe.hgetall(self.calls.cell(cell).keys.stats)
        total: dict[str, int] = {}
        for raw in pipe.execute():
            for k, v in raw.items():
                total[_s(k)] = total.get(_s(k), 0) + int(v)
        return total

    def tools(self) -> list[str]:
        """Every tool the ledger has seen; in cells mode the union of every cell's."""
        if self.cells is None:
            return sorted(_s(t) for t in self.redis.smembers(self.keys.tools))
        pipe = self.redis.pipeline(transaction=False)
        for cell in range(self.cells):
            pipe.smembers(self.calls.cell(cell).keys.tools)
        return sorted({_s(t) for raw in pipe.execute() for t in raw})


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


def record_of(raw: dict[Any, Any], with_history: bool = True) -> OperationRecord | None:
    """The record from its hash (HGETALL); its history from the ``h<n>`` fields."""
    if not raw:
        return None
    fields = {_s(k): _s(v) for k, v in raw.items()}
    return OperationRecord.from_fields(fields, entries_of(fields) if with_history else [])


def entries_of(fields: dict[str, str], after: int = 0) -> list[HistoryEntry]:
    """The history entries a record's fields hold (``h1`` .. ``h<hn>``), after the first
    ``after``."""
    n = int(fields.get("hn") or 0)
    names = (f"h{i}" for i in range(after + 1, n + 1))
    return [HistoryEntry.model_validate_json(fields[h]) for h in names if h in fields]


def fields_of(names: Sequence[str], values: Sequence[Any]) -> dict[str, str]:
    return {n: _s(v) for n, v in zip(names, values, strict=True) if v is not None}


def history_start(after: int) -> int:
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise errors.InvalidArguments("after must be a whole number >= 0")
    return after


def history_of(ref: str, raw: dict[Any, Any], after: int) -> list[HistoryEntry]:
    """The entries after the first ``after`` of the record read (HGETALL); none: no operation."""
    if not raw:
        raise errors.OperationNotFound(f"no operation {ref[:80]!r}")
    return entries_of({_s(k): _s(v) for k, v in raw.items()}, after)


def strs(raw: Any) -> list[str]:
    return [_s(x) for x in raw]


def _read_script_reply(conn: Connection) -> Any:
    """A raw script call's reply; a lost library reads as NOSCRIPT, as a lost script does."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        if lost_scripts(exc) and not isinstance(exc, redis.exceptions.NoScriptError):
            raise redis.exceptions.NoScriptError(str(exc)) from exc
        raise


def _due_rows(raw: Any) -> list[dict[str, str]]:
    names = ("ref", "due_score", *scripts.DUE_FIELDS)
    # cjson writes every field as a string, except a score it may write as a number
    return [dict(zip(names, map(str, row), strict=True)) for row in json.loads(raw)]


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
