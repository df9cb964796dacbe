"""What the ledger's scripts answer, read once for the sync and the async ledger.

Each reader turns a script's raw reply (bytes or strings, as the client decodes
them) into a typed record: :class:`SubmitResult`, :class:`Claim`, an
:class:`toolq.core.record.OperationRecord`, the scheduler's due rows. The outcomes are
:class:`enum.StrEnum` members, so they equal the words the scripts write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from toolq.adapters.ledger import scripts
from toolq.core import errors
from toolq.core.record import HistoryEntry, OperationRecord
from toolq.core.states import State


class Submitted(StrEnum):
    """SUBMIT's outcome."""

    CREATED = "created"
    EXISTS = "exists"
    CONFLICT = "conflict"


class Claimed(StrEnum):
    """CLAIM's outcome: the attempt is this holder's, or why it may not run."""

    CLAIMED = "claimed"
    HELD = "held"
    STALE = "stale"
    MISSING = "missing"
    #: Its dependency key held it back (toolq.decisions.deps): now waiting_retry.
    LIMITED = "limited"


@dataclass(frozen=True)
class SubmitResult:
    outcome: Submitted
    state: State


@dataclass(frozen=True)
class Claim:
    """What a claim returns: the operation's inputs, or why it may not run."""

    outcome: Claimed
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


def submit_result(out: Any) -> SubmitResult:
    return SubmitResult(Submitted(_s(out[0])), State(_s(out[1])))


def claim_result(raw: Any) -> Claim:
    out = strs(raw)
    outcome = Claimed(out[0])
    if outcome is Claimed.CLAIMED:
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
    if outcome is Claimed.HELD:
        return Claim(
            outcome,
            holder=out[1],
            lease_until_ms=int(float(out[2] or 0)),
            tool=out[3] if len(out) > 3 else "",
            vcheck=int(out[4]) if len(out) > 4 else 0,
            max_attempts=int(out[5]) if len(out) > 5 else 0,
            call_id=out[6] if len(out) > 6 else "",
        )
    if outcome is Claimed.STALE:
        return Claim(outcome, state=out[1])
    if outcome is Claimed.LIMITED:  # reason, not_before, due
        return Claim(outcome, state=out[1], lease_until_ms=int(float(out[2] or 0)))
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


def due_rows(raw: Any) -> list[dict[str, str]]:
    """CLAIM_DUE's rows (a JSON array of arrays) as dicts named by :data:`scripts.DUE_FIELDS`."""
    names = ("ref", "due_score", *scripts.DUE_FIELDS)
    # cjson writes every field as a string, except a score it may write as a number
    return [dict(zip(names, map(str, row), strict=True)) for row in json.loads(raw)]


def sleep_ms(raw: Any) -> int:
    """PLAN_SLEEP's answer: milliseconds (Lua may write a float)."""
    return int(float(raw))


def number(raw: Any) -> int:
    """A field read back as an integer (Lua may write a float); 0 when it is missing or
    not a number (a field a newer or older writer left out)."""
    try:
        return int(float(raw or 0))
    except (TypeError, ValueError):
        return 0


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
