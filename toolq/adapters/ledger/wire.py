"""The ledger's wire: the KEYS and ARGV of every script call, built without I/O.

:class:`ScriptArgs` builds them for one cell's keys (the single tag's, or a cell's),
once for the sync :class:`toolq.adapters.ledger.store.Ledger` and the async one
(:class:`toolq.adapters.ledger.aio.AsyncLedger`), which differ only in how they send them.
Where a Celery message goes is a strategy the caller passes (the topology picks
it, :mod:`toolq.topology.ledger`): :class:`InlinePush`, the script pushes to the
queue's list, or :class:`OutboxPush`, it appends to the cell's outbox stream.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolq.adapters.ledger import scripts
from toolq.adapters.ledger.ack import with_ack
from toolq.core.keys import Keys
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition


class Targets(ABC):
    """Where the messages of one APPLY call being built go."""

    @abstractmethod
    def target(self, queue: str, blobs: list[str]) -> tuple[str, int]:
        """The key a message for ``queue`` is pushed to, and the blob number of the
        queue's name (0: none, the key is the queue)."""


class _Queues(Targets):
    def target(self, queue: str, blobs: list[str]) -> tuple[str, int]:
        return queue, 0


@dataclass
class Outbox(Targets):
    """Outbox mode, for one APPLY call being built: the stream's key, and the blob
    number of each queue name already passed (one per queue)."""

    key: str
    names: dict[str, int]

    def target(self, queue: str, blobs: list[str]) -> tuple[str, int]:
        name = self.names.get(queue, 0)
        if not name:
            blobs.append(queue)
            name = self.names[queue] = len(blobs)
        return self.key, name


class Push(ABC):
    """Where the ledger's scripts put a Celery message."""

    #: The messages go to the outbox (what a status page or a test reads; the
    #: wire asks :meth:`submit_tail` and :meth:`targets`, never this).
    via_outbox = False

    @abstractmethod
    def submit_tail(self, keys: Keys, queue: str) -> tuple[list[str], list[Any]]:
        """SUBMIT's last KEYS and ARGV for a message to ``queue``."""

    @abstractmethod
    def targets(self, keys: Keys) -> Targets:
        """Where an APPLY call on ``keys`` pushes."""


class InlinePush(Push):
    """The script pushes the message to the queue's list (the broker is this server)."""

    def submit_tail(self, keys: Keys, queue: str) -> tuple[list[str], list[Any]]:
        return [queue], []

    def targets(self, keys: Keys) -> Targets:
        return _Queues()


class OutboxPush(Push):
    """The script appends the message, and its queue's name, to the cell's outbox
    stream (:attr:`toolq.core.keys.Keys.outbox`); a relay publishes it."""

    via_outbox = True

    def submit_tail(self, keys: Keys, queue: str) -> tuple[list[str], list[Any]]:
        return [keys.outbox], [queue]

    def targets(self, keys: Keys) -> Targets:
        return Outbox(keys.outbox, {})


def to_wire(
    t: Transition,
    out: list[Any],
    blobs: list[str],
    queues: dict[str, int],
    first_queue: int,
    targets: Targets | None = None,
) -> None:
    """Append the script's view of this transition to ``out``, APPLY's flat item
    (:data:`toolq.adapters.ledger.scripts.ITEM_HEAD`, then its counted lists). Long strings
    (the envelope, the Celery message, a history note) go to ``blobs``, passed as script arguments
    of their own, and the item names their number: JSON inside JSON would be
    escaped here and unescaped by the script. A queue it pushes to goes to
    ``queues`` (key -> KEYS index, from ``first_queue`` on): the script declares
    every key it writes. In outbox mode the key is the outbox (``targets``)."""
    envelope = push_queue = push_message = push_name = 0
    if t.envelope is not None:
        blobs.append(t.envelope.model_dump_json(exclude_none=True))
        envelope = len(blobs)
    if t.push is not None:
        queue, message = t.push
        blobs.append(message)
        push_message = len(blobs)
        key, push_name = (targets or _Queues()).target(queue, blobs)
        push_queue = queues.setdefault(key, first_queue + len(queues))
    due: int | bool = -1 if t.remove_due else (False if t.due_ms is None else t.due_ms)
    ttl: int | bool = False if t.ttl is None else t.ttl
    quiet: int | bool = t.quiet
    if t.note:
        # The note rides in the quiet slot, as its blob's number (negative: quiet), so
        # that the common item, without one, carries no byte more.
        blobs.append(json.dumps(t.note, separators=(",", ":")))
        quiet = -len(blobs) if t.quiet else len(blobs)
    out += (t.ref, t.to, t.by, t.code or False, quiet, t.attempt_incr, envelope, due)
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


Call = tuple[list[Any], list[Any]]


class ScriptArgs:
    """The KEYS and ARGV of the script calls on one cell's keys (``keys``)."""

    def __init__(self, keys: Keys, push: Push) -> None:
        self.keys = keys
        self.push = push
        self.fixed = scripts.fixed_keys(keys)
        self.notify = keys.notify

    @property
    def outbox(self) -> bool:
        """The messages of these calls go to the outbox (:attr:`Push.via_outbox`)."""
        return self.push.via_outbox

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
        extra: Sequence[tuple[str, str]] = (),
    ) -> Call:
        keys: list[Any] = [*self.fixed, self.keys.op(ref)]
        args: list[Any] = [self.notify, ref, tool, args_json, fp, call_id, now_ms, max_attempts]
        more = json.dumps([v for pair in extra for v in pair]) if extra else ""
        args += (deadline_ms, str(state), due_ms, message, more)
        if message:
            more_keys, more_args = self.push.submit_tail(self.keys, queue)
            keys += more_keys
            args += more_args
        return keys, args

    def claim(
        self,
        ref: str,
        attempt: int,
        holder: str,
        now_ms: int,
        lease_ms: int,
        kind: str,
        vcheck: int,
        ack: str | None,
        limits: str = "",
    ) -> Call:
        """``limits``: the worker's dependency limits (:func:`toolq.core.deps.limits_table`)."""
        keys: list[Any] = [*self.fixed, self.keys.op(ref)]
        args: list[Any] = [self.notify, ref, attempt, holder, now_ms, lease_ms, kind, vcheck]
        args.append(limits)
        with_ack(keys, args, ack)
        return keys, args

    def renew(self, now_ms: int, lease_ms: int, held: Sequence[tuple[str, int, str, str]]) -> Call:
        keys: list[Any] = list(self.fixed)
        args: list[Any] = [self.notify, now_ms, lease_ms]
        for ref, attempt, kind, holder in held:
            keys.append(self.keys.op(ref))
            args.extend((ref, attempt, kind, holder))
        return keys, args

    def apply(self, transitions: Sequence[Transition], now_ms: int, ack: str | None = None) -> Call:
        """APPLY's KEYS (fixed, the op of each item, the queues[, kombu's unacked
        keys]) and ARGV; ``ack``: the Celery delivery tag the call acknowledges."""
        keys: list[Any] = list(self.fixed)
        keys.extend(self.keys.op(t.ref) for t in transitions)
        blobs: list[str] = []
        queues: dict[str, int] = {}
        first_queue = len(keys) + 1  # KEYS is 1-based
        items: list[Any] = [len(transitions)]
        targets = self.push.targets(self.keys)
        for t in transitions:
            to_wire(t, items, blobs, queues, first_queue, targets)
        keys.extend(queues)  # in index order: dicts keep insertion order
        with_ack(keys, items, ack)
        return keys, [self.notify, now_ms, json.dumps(items, separators=(",", ":")), *blobs]

    def claim_due(self, now_ms: int, limit: int, hold_ms: int) -> Call:
        return [*self.fixed, self.keys.op_prefix], [self.notify, now_ms, limit, hold_ms]

    def plan_sleep(self, now_ms: int, max_ms: int) -> Call:
        return list(self.fixed), [self.notify, now_ms, max_ms]

    def cell_lease(self, holder: str, ttl_ms: int, mode: str) -> Call:
        return [*self.fixed, self.keys.cell_lease], [self.notify, holder, ttl_ms, mode]
