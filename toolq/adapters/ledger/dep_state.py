"""Dependency keys as an operator sees them: read a key's limiter into a view, list the
keys, and settle one (lift its pause, close its breaker).

The stored layout is :mod:`toolq.core.deps`'s (the limiter in the claim scripts writes
it); on the one tag a key has one limiter; in cells mode each cell limits the calls it
holds with its share of the key's limits, so a key's view sums its cells
(:func:`merged_view`) and an action applies to every cell where the key is. The reads
are queued on a pipeline and parsed without I/O
(:func:`queue_read`, :func:`parse_read`), so :class:`DepState` (sync) and
:class:`AsyncDepState` only send. The actions are the scripts DEP_ACT and DEP_DUE
(:mod:`toolq.adapters.ledger.lua_dep_ops`); what applies when, and the jitter, is
:mod:`toolq.decisions.dep_actions`.
"""

from __future__ import annotations

import json
import random
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, ValidationError

from toolq.adapters.ledger.runner import AsyncScripts, Scripts
from toolq.adapters.ledger.scripts import fixed_keys
from toolq.core import errors
from toolq.core.deps import DepView, Limits, is_dep_key
from toolq.core.keys import Keys
from toolq.core.layout import Layout
from toolq.core.text import as_text
from toolq.decisions.dep_actions import REFUSALS, DepAction, check_reason, due_times
from toolq.decisions.recovery.operator import check_actor

#: Refs per DEP_DUE call (the arguments of one script call stay small).
DUE_BATCH = 500


class OperatorAction(BaseModel):
    """One operator's action on a key, as ``op_log`` keeps it."""

    model_config = ConfigDict(frozen=True)

    at_ms: int
    by: str
    what: str
    why: str


class DepDetail(DepView):
    """:class:`DepView` and what only a key's own page shows."""

    #: The cell the key's limiter lives in (None: the single tag).
    cell: int | None = None
    #: Failures counted in the breaker's current window.
    fails: int = 0
    #: Times the key was paused, and its breaker opened.
    paused_count: int = 0
    opened_count: int = 0
    #: Operators' actions on the key, the newest first (the last few).
    actions: list[OperatorAction] = []


class DepActed(BaseModel):
    """What an action did: the key as it is now, and how many held-back calls it made due."""

    dependency: DepDetail
    made_due: int


def limiter_cells(layout: Layout) -> list[Keys]:
    """Where a key's limiter state may be: the one tag, or every cell (each limits the
    calls it holds, toolq.core.deps.limits_table's share)."""
    return layout.every_cell()


_BREAKER_RANK = {"closed": 0, "half_open": 1, "open": 2}


def merged_view(key: str, parts: Sequence[DepDetail]) -> DepDetail:
    """One key's view over its cells (pure): counts summed, the latest pause, the worst
    breaker, the newest actions first. One part is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    worst = max(parts, key=lambda v: _BREAKER_RANK[v.breaker])
    paused = [v for v in parts if v.paused_until_ms is not None]
    latest = max(paused, key=lambda v: v.paused_until_ms or 0) if paused else None
    used = [v.last_used_ms for v in parts if v.last_used_ms is not None]
    actions = sorted({a for v in parts for a in v.actions}, key=lambda a: -a.at_ms)
    return DepDetail(
        key=key,
        cell=None,
        limits=parts[0].limits,
        in_flight=sum(v.in_flight for v in parts),
        waiting=sum(v.waiting for v in parts),
        paused_until_ms=latest.paused_until_ms if latest else None,
        pause_code=latest.pause_code if latest else None,
        breaker=worst.breaker,
        open_until_ms=worst.open_until_ms,
        probe=worst.probe,
        admitted=sum(v.admitted for v in parts),
        limited=sum(v.limited for v in parts),
        last_used_ms=max(used) if used else None,
        fails=sum(v.fails for v in parts),
        paused_count=sum(v.paused_count for v in parts),
        opened_count=sum(v.opened_count for v in parts),
        actions=actions[:20],
    )


def checked_key(key: object) -> str:
    """``key`` if it is a dependency key's shape, else errors.InvalidDependencyKey."""
    if not is_dep_key(key):
        raise errors.InvalidDependencyKey(
            "not a dependency key: 1-128 of letters, digits and _ . : @ + -, "
            "starting with a letter or digit"
        )
    assert isinstance(key, str)
    return key


# ---------------------------------------------------------------------- sans I/O


def queue_list(pipe: Any, layout: Layout) -> None:
    """Every cell's set of keys (:attr:`Keys.deps`)."""
    for keys in layout.every_cell():
        pipe.zrange(keys.deps, 0, -1)


def parse_list(replies: Sequence[Any]) -> list[str]:
    return sorted({as_text(k) for reply in replies for k in reply})


def queue_read(pipe: Any, keys: Keys, key: str, now_ms: int) -> None:
    """One key's hash, its slots whose lease has not ended, its waiting calls, its last use."""
    pipe.hgetall(keys.dep(key))
    pipe.zcount(keys.dep_slots(key), f"({now_ms}", "+inf")
    pipe.zcard(keys.dep_waiting(key))
    pipe.zscore(keys.deps, key)


READS_PER_KEY = 4


def parse_read(key: str, cell: int | None, replies: Iterator[Any], now_ms: int) -> DepDetail | None:
    """The key's view from :func:`queue_read`'s replies; None for a key never used."""
    raw, in_flight, waiting, last = (next(replies) for _ in range(READS_PER_KEY))
    fields = {as_text(k): as_text(v) for k, v in (raw or {}).items()}
    if not fields and last is None and not in_flight and not waiting:
        return None
    return view_of(key, cell, fields, int(in_flight), int(waiting), last, now_ms)


def _int(fields: dict[str, str], name: str) -> int | None:
    try:
        return int(float(fields[name]))
    except (KeyError, ValueError):
        return None


def limits_of(fields: dict[str, str]) -> Limits:
    """The limits the hash records (what the last claim used); a field that does not
    read is left at its default."""
    given: dict[str, Any] = {}
    if fields.get("rate"):
        given["rate"] = fields["rate"]
    for name in ("burst", "concurrency", "breaker_failures"):
        n = _int(fields, name)
        if n is not None and n > 0:
            given[name] = n
    for name, ms in (("breaker_window", "breaker_window_ms"), ("breaker_open", "breaker_open_ms")):
        n = _int(fields, ms)
        if n is not None and n > 0:
            given[name] = n / 1000
    try:
        return Limits(**given)
    except ValidationError:
        return Limits(**{k: v for k, v in given.items() if k != "rate"})


def actions_of(text: str | None) -> list[OperatorAction]:
    if not text:
        return []
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    out = []
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict):
            try:
                out.append(
                    OperatorAction(
                        at_ms=int(e.get("at", 0)),
                        by=str(e.get("by", "")),
                        what=str(e.get("what", "")),
                        why=str(e.get("why", "")),
                    )
                )
            except (TypeError, ValueError):
                continue
    return out


def queue_reads(pipe: Any, layout: Layout, names: Sequence[str], now_ms: int) -> None:
    """:func:`queue_read` of each key in each cell it may be in."""
    for key in names:
        for at in limiter_cells(layout):
            queue_read(pipe, at, key, now_ms)


def parse_reads(
    layout: Layout, names: Sequence[str], replies: Iterator[Any], now_ms: int
) -> list[DepDetail]:
    """The views :func:`queue_reads` asked for: each key's cells merged, the keys never
    used left out."""
    out = []
    for key in names:
        parts = [parse_read(key, at.cell, replies, now_ms) for at in limiter_cells(layout)]
        found = [v for v in parts if v is not None]
        if found:
            out.append(merged_view(key, found))
    return out


def view_of(
    key: str,
    cell: int | None,
    fields: dict[str, str],
    in_flight: int,
    waiting: int,
    last_used: Any,
    now_ms: int,
) -> DepDetail:
    """The view of one key from its hash and counts (pure): the pause only while it runs,
    the breaker as stored (``closed`` for anything else)."""
    paused = _int(fields, "paused_until")
    if paused is not None and paused <= now_ms:
        paused = None
    breaker = fields.get("breaker", "closed")
    if breaker not in ("closed", "open", "half_open"):
        breaker = "closed"
    return DepDetail(
        key=key,
        cell=cell,
        limits=limits_of(fields),
        in_flight=in_flight,
        waiting=waiting,
        paused_until_ms=paused,
        pause_code=(fields.get("pause_code") or None) if paused is not None else None,
        breaker=breaker,
        open_until_ms=_int(fields, "open_until") if breaker != "closed" else None,
        probe=(fields.get("probe") or None) if breaker == "half_open" else None,
        admitted=_int(fields, "n_admitted") or 0,
        limited=_int(fields, "n_limited") or 0,
        last_used_ms=None if last_used is None else int(float(last_used)),
        fails=_int(fields, "fails") or 0,
        paused_count=_int(fields, "n_paused") or 0,
        opened_count=_int(fields, "n_opened") or 0,
        actions=actions_of(fields.get("op_log")),
    )


def needs_attention(view: DepView) -> bool:
    """Whether ``toolq status`` names the key: paused, its breaker not closed, or calls
    waiting on it."""
    return view.paused_until_ms is not None or view.breaker != "closed" or view.waiting > 0


def act_args(
    keys: Keys, key: str, action: DepAction, by: str, why: str, now_ms: int
) -> tuple[list[str], list[Any]]:
    """DEP_ACT's KEYS and ARGV."""
    return (
        [*fixed_keys(keys), keys.dep(key), keys.dep_waiting(key)],
        [keys.notify, now_ms, action.value, by, why],
    )


def held_back(key: str, reply: Sequence[Any]) -> list[str]:
    """The refs DEP_ACT answered, or the refusal it said, raised."""
    verdict = as_text(reply[0])
    if verdict == "ok":
        return [as_text(r) for r in reply[1:]]
    if verdict == "unknown":
        raise errors.UnknownDependency(f"no dependency key {key!r} in the ledger")
    found = REFUSALS.get(verdict)
    message = found.message if found else "the action does not apply to the key as it is"
    raise errors.DependencyActionRefused(verdict, f"{key}: {message}", dependency=key)


def held_back_all(key: str, replies: Sequence[Sequence[Any]]) -> list[str]:
    """The refs DEP_ACT answered in every cell where the action applied; if it applied
    in none, the refusal of a cell where the key is (else UnknownDependency)."""
    refs: list[str] = []
    refused: Exception | None = None
    applied = False
    for reply in replies:
        try:
            refs += held_back(key, reply)
            applied = True
        except errors.UnknownDependency as exc:
            refused = refused or exc
        except errors.DependencyActionRefused as exc:
            refused = exc
    if not applied:
        assert refused is not None
        raise refused
    return refs


def due_calls(
    layout: Layout, key: str, refs: list[str], now_ms: int, seed: int
) -> list[tuple[list[str], list[Any]]]:
    """DEP_DUE's KEYS and ARGV: one call per cell of the refs (and per batch)."""
    timed = due_times(refs, now_ms, seed)
    calls = []
    for keys, where in layout.group(refs).items():
        for i in range(0, len(where), DUE_BATCH):
            args: list[Any] = [keys.notify, now_ms, key]
            for j in where[i : i + DUE_BATCH]:
                args += timed[j]
            calls.append(([*fixed_keys(keys), keys.op_prefix], args))
    return calls


def _checked(key: object, action: object, reason: object, by: object) -> tuple[str, DepAction, str]:
    check_actor(by)  # who acts: one line of printable text, as for an operation
    k = checked_key(key)
    try:
        act = DepAction(str(action))
    except ValueError:
        raise errors.InvalidArguments(f"no action {action!r}: lift or close") from None
    try:
        why = check_reason(reason)
    except ValueError as exc:
        raise errors.InvalidArguments(str(exc)) from None
    return k, act, why


# ---------------------------------------------------------------------- sync


class DepState:
    """The dependency keys of the ledger on ``client``, laid out as ``layout`` says."""

    def __init__(self, client: redis.Redis, layout: Layout, scripts: Scripts | None = None):
        self.client = client
        self.layout = layout
        self._scripts = scripts

    @property
    def scripts(self) -> Scripts:
        if self._scripts is None:
            self._scripts = Scripts(self.client)
        return self._scripts

    def keys(self) -> list[str]:
        pipe = self.client.pipeline(transaction=False)
        queue_list(pipe, self.layout)
        return parse_list(pipe.execute())

    def views(self, now_ms: int, keys: Sequence[str] | None = None) -> list[DepDetail]:
        """Every key's view (or those of ``keys``), by key."""
        names = self.keys() if keys is None else list(keys)
        pipe = self.client.pipeline(transaction=False)
        queue_reads(pipe, self.layout, names, now_ms)
        return parse_reads(self.layout, names, iter(pipe.execute()), now_ms)

    def view(self, key: str, now_ms: int) -> DepDetail:
        """One key's view; InvalidDependencyKey, UnknownDependency."""
        found = self.views(now_ms, [checked_key(key)])
        if not found:
            raise errors.UnknownDependency(f"no dependency key {key!r} in the ledger")
        return found[0]

    def act(self, key: str, action: str, *, by: str, reason: str, now_ms: int) -> DepActed:
        """Lift the key's pause or close its breaker, as ``by`` for ``reason``; the calls it
        held back are due now (plus jitter). Refused (nothing written):
        InvalidDependencyKey, InvalidArguments, UnknownDependency, DependencyActionRefused."""
        k, act, why = _checked(key, action, reason, by)
        answers = [
            self.scripts("dep_act", *act_args(at, k, act, by, why, now_ms))
            for at in limiter_cells(self.layout)
        ]
        refs = held_back_all(k, answers)
        moved = 0
        for call in due_calls(self.layout, k, refs, now_ms, random.getrandbits(32)):
            moved += int(self.scripts("dep_due", *call))
        return DepActed(dependency=self.view(k, now_ms), made_due=moved)


# ---------------------------------------------------------------------- asyncio

_ASYNC_SCRIPTS: weakref.WeakKeyDictionary[aioredis.Redis, AsyncScripts] = (
    weakref.WeakKeyDictionary()
)


def async_scripts(client: aioredis.Redis) -> AsyncScripts:
    """The scripts on ``client``, loaded once per client."""
    found = _ASYNC_SCRIPTS.get(client)
    if found is None:
        found = _ASYNC_SCRIPTS[client] = AsyncScripts(client)
    return found


class AsyncDepState:
    """:class:`DepState` on ``redis.asyncio``."""

    def __init__(self, client: aioredis.Redis, layout: Layout) -> None:
        self.client = client
        self.layout = layout

    async def keys(self) -> list[str]:
        pipe = self.client.pipeline(transaction=False)
        queue_list(pipe, self.layout)
        return parse_list(await pipe.execute())

    async def views(self, now_ms: int, keys: Sequence[str] | None = None) -> list[DepDetail]:
        names = await self.keys() if keys is None else list(keys)
        pipe = self.client.pipeline(transaction=False)
        queue_reads(pipe, self.layout, names, now_ms)
        return parse_reads(self.layout, names, iter(await pipe.execute()), now_ms)

    async def view(self, key: str, now_ms: int) -> DepDetail:
        found = await self.views(now_ms, [checked_key(key)])
        if not found:
            raise errors.UnknownDependency(f"no dependency key {key!r} in the ledger")
        return found[0]

    async def act(self, key: str, action: str, *, by: str, reason: str, now_ms: int) -> DepActed:
        k, act, why = _checked(key, action, reason, by)
        scripts = async_scripts(self.client)
        answers = [
            await scripts("dep_act", *act_args(at, k, act, by, why, now_ms))
            for at in limiter_cells(self.layout)
        ]
        refs = held_back_all(k, answers)
        moved = 0
        for call in due_calls(self.layout, k, refs, now_ms, random.getrandbits(32)):
            moved += int(await scripts("dep_due", *call))
        return DepActed(dependency=await self.view(k, now_ms), made_due=moved)
