"""A list request, checked, and its cursor: pure (see :mod:`toolq.adapters.ledger.lists`)."""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime

from toolq.core import errors
from toolq.core.envelope import FieldError, is_valid_code
from toolq.core.states import State

#: Rows a page may ask for.
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
#: The longest ``older_than`` (s): ten years; past it a bound means nothing.
MAX_AGE_S = 10 * 365 * 86400
#: A tool name as registration allows it (:meth:`toolq.client.queue.ToolQueue.tool`).
TOOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")

_CURSOR_VERSION = 1


@dataclass(frozen=True, order=True)
class Position:
    """Where an index entry sits in the walk: its score (ms), then its ref."""

    score: int
    ref: str


@dataclass(frozen=True)
class ListQuery:
    """A checked request for one page (see :func:`parse_query`)."""

    #: None: every state (a search).
    state: State | None
    tool: str | None = None
    code: str | None = None
    ref_contains: str | None = None
    #: Only entries that entered the state at or before this time (ms).
    max_score: int | None = None
    after: Position | None = None
    limit: int = DEFAULT_LIMIT
    newest_first: bool = False
    #: The search box: a ref containing it, or a tool whose name contains it.
    search: str | None = None
    #: A "previous page": walk back from ``after``, then show the rows in the page's order.
    backward: bool = False

    @property
    def filtered(self) -> bool:
        """Whether the index alone cannot answer (so the walk is budgeted)."""
        return self.code is not None or self.ref_contains is not None or self.search is not None

    @property
    def walk_newest(self) -> bool:
        """The order the walk goes in: the page's, or its reverse for a previous page."""
        return self.newest_first != self.backward

    def tool_matches(self, tool: str) -> bool:
        """Whether every operation of ``tool`` matches the search (its name contains it)."""
        return self.search is not None and self.search.lower() in tool.lower()


# --------------------------------------------------------------------------- checking (pure)


def parse_query(
    state: object,
    *,
    tool: object = None,
    code: object = None,
    ref_contains: object = None,
    older_than_s: object = None,
    cursor: object = None,
    limit: object = DEFAULT_LIMIT,
    newest_first: bool = False,
    search: object = None,
    now_ms: int,
    max_ref_length: int = 200,
) -> ListQuery:
    """Check a list request; :class:`errors.InvalidArguments` names every bad field.

    ``state`` None lists every state (what the search box does)."""
    bad: list[FieldError] = []

    def refuse(name: str, rule: str) -> None:
        bad.append(FieldError(field=name, rule=rule))

    st: State | None = None
    if state is not None:
        try:
            st = State(str(state))
        except ValueError:
            refuse("state", f"one of {', '.join(s.value for s in State)}")
    if tool is not None and not (isinstance(tool, str) and TOOL_RE.fullmatch(tool)):
        refuse("tool", "a tool name: a letter or _, then up to 63 of A-Z a-z 0-9 _ . -")
    if code is not None and not (isinstance(code, str) and is_valid_code(code)):
        refuse("code", "an UPPER_SNAKE code, e.g. RATE_LIMITED")
    if ref_contains is not None and not (
        isinstance(ref_contains, str)
        and 0 < len(ref_contains) <= max_ref_length
        and ref_contains.isprintable()
    ):
        refuse("ref_contains", f"1 to {max_ref_length} printable characters")
    if search is not None and not _printable(search, max_ref_length):
        refuse("q", f"1 to {max_ref_length} printable characters (a part of a ref, or a tool)")
    max_score = None
    if older_than_s is not None:
        age = _number(older_than_s)
        if age is None or not 0 <= age <= MAX_AGE_S:
            refuse("older_than", f"seconds, from 0 to {MAX_AGE_S}")
        else:
            max_score = now_ms - int(age * 1000)
    n = _number(limit)
    if n is None or n != int(n) or not 1 <= n <= MAX_LIMIT:
        refuse("limit", f"a whole number from 1 to {MAX_LIMIT}")
    after, backward = None, False
    if cursor is not None:
        try:
            after, direction, backward = read_cursor(cursor)
        except ValueError:
            refuse("cursor", "a next_cursor from a previous page, unchanged")
        else:
            if direction != newest_first:
                refuse("cursor", "from a page of the same order (oldest or newest first)")
    if bad or (st is None and state is not None) or n is None:
        names = ", ".join(dict.fromkeys(fe.field for fe in bad))
        raise errors.InvalidArguments(f"invalid list request ({names})", field_errors=bad)
    return ListQuery(
        state=st,
        tool=tool if isinstance(tool, str) else None,
        code=code if isinstance(code, str) else None,
        ref_contains=ref_contains if isinstance(ref_contains, str) else None,
        max_score=max_score,
        after=after,
        limit=int(n),
        newest_first=newest_first,
        search=search if isinstance(search, str) else None,
        backward=backward,
    )


def _printable(value: object, longest: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= longest and value.isprintable()


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def encode_cursor(pos: Position, newest_first: bool = False, backward: bool = False) -> str:
    """An opaque, URL-safe token for ``pos`` (and the page's order); ``backward``: the
    page before ``pos`` (a "previous page" link), not the one after it."""
    fields: list[object] = [_CURSOR_VERSION, int(newest_first), pos.score, pos.ref]
    if backward:
        fields.append(1)
    raw = json.dumps(fields, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(token: object) -> tuple[Position, bool]:
    """The position and order in a cursor; ``ValueError`` for anything else."""
    pos, newest, _backward = read_cursor(token)
    return pos, newest


def read_cursor(token: object) -> tuple[Position, bool, bool]:
    """The position, order and direction (backward: a previous page) in a cursor;
    ``ValueError`` for anything else."""
    if not isinstance(token, str) or not 0 < len(token) <= 1024:
        raise ValueError("not a cursor")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, newest, score, ref, *rest = json.loads(raw)
    except (ValueError, TypeError) as exc:  # binascii.Error and JSONDecodeError are ValueErrors
        raise ValueError("not a cursor") from exc
    ok = (
        version == _CURSOR_VERSION
        and newest in (0, 1)
        and type(score) is int
        and isinstance(ref, str)
        and ref
        and rest in ([], [1])
    )
    if not ok:
        raise ValueError("not a cursor")
    return Position(score, ref), bool(newest), bool(rest)


def not_before_ms(text: str) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None
