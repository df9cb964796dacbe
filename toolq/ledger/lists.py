"""Lists of operations in a state, read page by page from the state indexes.

Every operation is in one sorted set per tool and state
(:meth:`toolq.keys.Keys.index`), scored by when it entered that state. A page
is a walk of those sets in score order (oldest first, or newest first),
merged across tools, starting after a cursor:

- **Cursor.** The (score, ref) of the last entry a page examined; a sorted
  set orders equal scores by member, so (score, ref) is a total order and the
  next page starts exactly after it, whatever entered or left the list
  meanwhile. Each set is read with ``ZRANGE BYSCORE ... LIMIT`` from the
  cursor's score: the cost is O(log N + page), never an offset into the set.
- **Filters.** ``older_than`` is a bound on the score: the index serves it,
  and the total stays exact (``ZCOUNT``). ``ref_contains`` and ``code`` are
  not in the index: a filtered page examines at most :data:`SCAN_BUDGET`
  entries (``code`` reads their records, at most :data:`CODE_BUDGET`), then
  returns what matched with ``partial`` set and a cursor where it stopped,
  so that no page costs more than a bounded read however rare the matches are.

The checks, the cursor and which filters the index serves are pure
(:func:`parse_query`, :func:`encode_cursor`), tested as tables. The walk
itself runs in the server, one read-only script per page (:data:`LIST`):
:func:`read_page` and :func:`aread_page` send it on a sync or an async client.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
import redis.asyncio as aioredis

from toolq import errors
from toolq.envelope import FieldError, is_valid_code
from toolq.keys import Keys
from toolq.record import OperationPage, OperationSummary
from toolq.states import State

#: Rows a page may ask for.
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
#: Index entries a filtered page examines at most (``ref_contains``: members only).
SCAN_BUDGET = 5_000
#: Records a ``code`` filter reads at most per page (their envelopes are parsed).
CODE_BUDGET = 1_000
#: Entries read from one index per round trip while filtering.
CHUNK = 1_000
#: The longest ``older_than`` (s): ten years; past it a bound means nothing.
MAX_AGE_S = 10 * 365 * 86400
#: A tool name as registration allows it (:meth:`toolq.queue.ToolQueue.tool`).
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

    state: State
    tool: str | None = None
    code: str | None = None
    ref_contains: str | None = None
    #: Only entries that entered the state at or before this time (ms).
    max_score: int | None = None
    after: Position | None = None
    limit: int = DEFAULT_LIMIT
    newest_first: bool = False

    @property
    def filtered(self) -> bool:
        """Whether the index alone cannot answer (so the walk is budgeted)."""
        return self.code is not None or self.ref_contains is not None


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
    now_ms: int,
    max_ref_length: int = 200,
) -> ListQuery:
    """Check a list request; :class:`errors.InvalidArguments` names every bad field."""
    bad: list[FieldError] = []

    def refuse(name: str, rule: str) -> None:
        bad.append(FieldError(field=name, rule=rule))

    st: State | None = None
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
    after = None
    if cursor is not None:
        try:
            after, direction = decode_cursor(cursor)
        except ValueError:
            refuse("cursor", "a next_cursor from a previous page, unchanged")
        else:
            if direction != newest_first:
                refuse("cursor", "from a page of the same order (oldest or newest first)")
    if bad or st is None or n is None:
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
    )


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


def encode_cursor(pos: Position, newest_first: bool = False) -> str:
    """An opaque, URL-safe token for ``pos`` (and the walk's direction)."""
    fields = [_CURSOR_VERSION, int(newest_first), pos.score, pos.ref]
    raw = json.dumps(fields, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(token: object) -> tuple[Position, bool]:
    """The position and direction in a cursor; ``ValueError`` for anything else."""
    if not isinstance(token, str) or not 0 < len(token) <= 1024:
        raise ValueError("not a cursor")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, newest, score, ref = json.loads(raw)
    except (ValueError, TypeError) as exc:  # binascii.Error and JSONDecodeError are ValueErrors
        raise ValueError("not a cursor") from exc
    ok = (
        version == _CURSOR_VERSION
        and newest in (0, 1)
        and type(score) is int
        and isinstance(ref, str)
        and ref
    )
    if not ok:
        raise ValueError("not a cursor")
    return Position(score, ref), bool(newest)


def _not_before_ms(text: str) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None


# --------------------------------------------------------------------------- the walk (Lua)

# One page, walked in the server: a read-only script, so that a page is one round
# trip and the entries it passes over never cross the wire (parsing a reply costs
# redis-py ~2 us an element: a filtered page that examined 5,000 entries and read
# 1,000 records spent 240 ms in Python when it was walked from here).
#
# KEYS: the record prefix (records are named from the refs found), the due set,
#       then one state index per tool.
# ARGV: newest(0/1) after_score after_ref bound limit scan_budget code_budget chunk
#       ref_part code state count_total(0/1)      ('' for none)
# ->    JSON {rows=[[ref, tool, score, attempt, max_attempts, code, not_before, due]],
#             last=[score, ref] | nil, more=bool, scanned=n, budget=bool, total=n | nil}
#
# Members are compared byte by byte, as a sorted set orders them: Lua's own `<`
# on strings follows the server's locale, which Redis sets from the environment.
LIST = r"""
local OPS, DUE = KEYS[1], KEYS[2]
local newest = ARGV[1] == '1'
local has_after = ARGV[2] ~= ''
local after_score, after_ref = tonumber(ARGV[2]), ARGV[3]
local bound = ARGV[4]
local limit, scan_budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local code_budget, chunk = tonumber(ARGV[7]), tonumber(ARGV[8])
local ref_part, code, want = ARGV[9], ARGV[10], ARGV[11]

local function lt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local function before(s1, r1, s2, r2)  -- does (s1, r1) come first in the walk?
  if s1 ~= s2 then
    if newest then return s1 > s2 end
    return s1 < s2
  end
  if newest then return lt(r2, r1) end
  return lt(r1, r2)
end

local far = '+inf'
if newest then far = '-inf' elseif bound ~= '' then far = bound end
local first
if has_after then
  first = after_score
  if newest and bound ~= '' and tonumber(bound) < first then first = tonumber(bound) end
elseif newest then
  first = (bound ~= '' and bound) or '+inf'
else
  first = '-inf'
end

local sources = {}
for i = 3, #KEYS do
  table.insert(sources, {key = KEYS[i], start = first, offset = 0, done = false, buf = {}, at = 1})
end

-- The next chunk of one index: from where the last one ended (its score, and how
-- many entries at exactly that score were read), keeping entries past the cursor.
local function fetch(s)
  local r
  if newest then
    r = redis.call('ZRANGE', s.key, s.start, far, 'BYSCORE', 'REV', 'LIMIT', s.offset, chunk,
      'WITHSCORES')
  else
    r = redis.call('ZRANGE', s.key, s.start, far, 'BYSCORE', 'LIMIT', s.offset, chunk,
      'WITHSCORES')
  end
  local n = #r / 2
  if n < chunk then s.done = true end
  s.buf, s.at = {}, 1
  if n == 0 then return end
  local last = tonumber(r[#r])
  local same = 0
  for i = 2, #r, 2 do if tonumber(r[i]) == last then same = same + 1 end end
  if type(s.start) == 'number' and s.start == last then
    s.offset = s.offset + n
  else
    s.start, s.offset = last, same
  end
  for i = 1, #r, 2 do
    local score = tonumber(r[i + 1])
    if not has_after or before(after_score, after_ref, score, r[i]) then
      table.insert(s.buf, {score, r[i], r[i + 1]})
    end
  end
end

-- (code, not_before) of a failure's envelope; a success has neither.
local function envelope_fields(env)
  if not env or not string.find(string.sub(env, 1, 16), 'false', 1, true) then return '', '' end
  local ok, d = pcall(cjson.decode, env)
  if not ok or type(d) ~= 'table' then return '', '' end
  local c, nb = '', ''
  if type(d.code) == 'string' then c = d.code end
  if type(d.retry) == 'table' and type(d.retry.not_before) == 'string' then
    nb = d.retry.not_before
  end
  return c, nb
end

local rows, examined, code_reads, last, budget = {}, 0, 0, nil, false
while #rows < limit do
  if examined >= scan_budget or code_reads >= code_budget then budget = true; break end
  local best = nil
  for _, s in ipairs(sources) do
    while s.at > #s.buf and not s.done do fetch(s) end
    if s.at <= #s.buf then
      local e = s.buf[s.at]
      if best == nil or before(e[1], e[2], best.buf[best.at][1], best.buf[best.at][2]) then
        best = s
      end
    end
  end
  if best == nil then break end
  local e = best.buf[best.at]
  best.at = best.at + 1
  examined = examined + 1
  last = e
  local ref = e[2]
  if ref_part == '' or string.find(ref, ref_part, 1, true) then
    local f = redis.call('HMGET', OPS .. ref, 'state', 'tool', 'attempt', 'max_attempts',
      'envelope')
    if f[1] == want then  -- else it moved on since the index was read, or expired
      local c, nb = envelope_fields(f[5] or nil)
      local keep = true
      if code ~= '' then
        code_reads = code_reads + 1
        keep = f[5] ~= false and string.find(f[5], '"' .. code .. '"', 1, true) ~= nil
          and c == code
      end
      if keep then
        local due = redis.call('ZSCORE', DUE, ref)
        table.insert(rows, {ref, f[2] or '', e[3], f[3] or '0', f[4] or '0', c, nb, due or ''})
      end
    end
  end
end
local more = false
for _, s in ipairs(sources) do
  if s.at <= #s.buf or not s.done then more = true end
end
local total = nil
if ARGV[12] == '1' then
  total = 0
  local hi = (bound ~= '' and bound) or '+inf'
  for _, s in ipairs(sources) do total = total + redis.call('ZCOUNT', s.key, '-inf', hi) end
end
local out = {rows = rows, more = more, scanned = examined, budget = budget, total = total}
if last then out.last = {last[3], last[2]} end
if #rows == 0 then out.rows = nil end  -- cjson writes an empty table as {}
return cjson.encode(out)
"""


def _args(q: ListQuery) -> list[str | int]:
    after = q.after
    return [
        int(q.newest_first),
        "" if after is None else after.score,
        "" if after is None else after.ref,
        "" if q.max_score is None else q.max_score,
        q.limit,
        SCAN_BUDGET,
        CODE_BUDGET if q.code is not None else SCAN_BUDGET,
        CHUNK if q.filtered else q.limit + 1,
        q.ref_contains or "",
        q.code or "",
        q.state.value,
        int(not q.filtered),
    ]


def _keys(keys: Keys, tools: list[str], q: ListQuery) -> list[str]:
    return [keys.op_prefix, keys.due, *(keys.index(t, q.state) for t in tools)]


def merge_cells(raws: list[Any], q: ListQuery) -> OperationPage:
    """Cells mode: the pages one query read in every cell as one page. Pure.

    Positions (score, ref) are a total order in every cell, so the merged walk is
    the cells' rows in that order, up to where the cell that stopped first stopped
    (past it another cell's rows could be missing), at most ``q.limit`` of them; the
    next page starts after the last row it gives, or where that cell stopped."""
    outs = [json.loads(raw) for raw in raws]

    def at(score: Any, ref: Any) -> Position:
        return Position(int(float(score)), str(ref))

    rows = sorted(
        (row for out in outs for row in out.get("rows") or ()),
        key=lambda row: at(row[2], row[0]),
        reverse=q.newest_first,
    )
    stops = [at(*out["last"]) for out in outs if out.get("more") and out.get("last")]
    stop = (max(stops) if q.newest_first else min(stops)) if stops else None
    if stop is not None:
        rows = [
            row
            for row in rows
            if (at(row[2], row[0]) >= stop if q.newest_first else at(row[2], row[0]) <= stop)
        ]
    more = stop is not None or len(rows) > q.limit
    if len(rows) > q.limit:
        rows = rows[: q.limit]
        stop = at(rows[-1][2], rows[-1][0])
    totals = [out.get("total") for out in outs]
    merged = {
        "rows": rows,
        "more": more,
        "last": None if stop is None else [stop.score, stop.ref],
        "total": None if None in totals else sum(int(t) for t in totals),
        "budget": any(out.get("budget") for out in outs),
        "scanned": sum(int(out.get("scanned") or 0) for out in outs),
    }
    return page_of(json.dumps(merged), q)


def page_of(raw: Any, q: ListQuery) -> OperationPage:
    """The script's answer as a page (the rows' fields as the script found them)."""
    out = json.loads(raw)
    items = [
        OperationSummary(
            operation_ref=ref,
            tool=tool,
            state=q.state,
            entered_ms=int(float(score)),
            attempt=int(attempt),
            max_attempts=int(max_attempts),
            code=code or None,
            not_before_ms=_not_before_ms(not_before),
            due_ms=int(float(due)) if due else None,
        )
        for ref, tool, score, attempt, max_attempts, code, not_before, due in out.get("rows") or ()
    ]
    last = out.get("last")
    more = bool(out.get("more"))
    cursor = None
    if more and last:
        cursor = encode_cursor(Position(int(float(last[0])), str(last[1])), q.newest_first)
    total = out.get("total")
    return OperationPage(
        items=items,
        next_cursor=cursor,
        total=None if q.filtered or total is None else int(total),
        partial=bool(out.get("budget")) and len(items) < q.limit and more,
        scanned=int(out.get("scanned") or 0),
    )


def _tools(q: ListQuery, members: Any) -> list[str]:
    return [q.tool] if q.tool is not None else sorted(_s(t) for t in members)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _empty(q: ListQuery) -> OperationPage:
    return OperationPage(items=[], next_cursor=None, total=None if q.filtered else 0)


# --------------------------------------------------------------------------- sending it


def read_page(client: redis.Redis, q: ListQuery, keys: Keys) -> OperationPage:
    """One page on a sync client: the tools (unless ``q.tool``), then the script."""
    tools = _tools(q, () if q.tool is not None else client.smembers(keys.tools))
    if not tools:
        return _empty(q)
    script = client.register_script(LIST)
    return page_of(script(keys=_keys(keys, tools, q), args=_args(q)), q)


def read_page_cells(client: redis.Redis, q: ListQuery, cells: list[Keys]) -> OperationPage:
    """Cells mode: the page read in every cell (one script call each) and merged."""
    if q.tool is None:
        pipe = client.pipeline(transaction=False)
        for keys in cells:
            pipe.smembers(keys.tools)
        tools = _tools(q, {t for members in pipe.execute() for t in members})
    else:
        tools = [q.tool]
    if not tools:
        return _empty(q)
    script = client.register_script(LIST)
    return merge_cells([script(keys=_keys(keys, tools, q), args=_args(q)) for keys in cells], q)


async def aread_page_cells(
    client: aioredis.Redis, q: ListQuery, cells: list[Keys]
) -> OperationPage:
    """:func:`read_page_cells` on ``redis.asyncio``."""
    if q.tool is None:
        pipe = client.pipeline(transaction=False)
        for keys in cells:
            pipe.smembers(keys.tools)
        tools = _tools(q, {t for members in await pipe.execute() for t in members})
    else:
        tools = [q.tool]
    if not tools:
        return _empty(q)
    script = client.register_script(LIST)
    raws = [await script(keys=_keys(keys, tools, q), args=_args(q)) for keys in cells]
    return merge_cells(raws, q)


async def aread_page(client: aioredis.Redis, q: ListQuery, keys: Keys) -> OperationPage:
    """:func:`read_page` on ``redis.asyncio``."""
    tools = _tools(q, () if q.tool is not None else await client.smembers(keys.tools))
    if not tools:
        return _empty(q)
    script = client.register_script(LIST)
    return page_of(await script(keys=_keys(keys, tools, q), args=_args(q)), q)
