"""One page walked in the server (:data:`LIST`) and its answer read as a page; in
cells mode the pages of every cell merged (:func:`merge_cells`). Pure but the Lua.
"""

from __future__ import annotations

import json
from typing import Any

from toolq.adapters.ledger.list_query import ListQuery, Position, encode_cursor, not_before_ms
from toolq.core.keys import Keys
from toolq.core.record import OperationPage, OperationSummary
from toolq.core.states import State
from toolq.core.text import as_text

# --------------------------------------------------------------------------- the walk (Lua)

# One page, walked in the server: a read-only script, so that a page is one round
# trip and the entries it passes over never cross the wire (parsing a reply costs
# redis-py ~2 us an element: a filtered page that examined 5,000 entries and read
# 1,000 records spent 240 ms in Python when it was walked from here).
#
# KEYS: the record prefix (records are named from the refs found), the due set,
#       then the state indexes walked (one per tool, or per tool and state).
# ARGV: newest(0/1) after_score after_ref bound limit scan_budget code_budget chunk
#       ref_part code count_total(0/1) search, then per index: its state and
#       whole(0/1) (its tool matches the search: every entry does)   ('' for none)
# ->    JSON {rows=[[ref, tool, score, attempt, max_attempts, code, not_before, due,
#             state, created]], last=[score, ref] | nil, more=bool, scanned=n,
#             budget=bool, total=n | nil}
#
# The walk looks for limit + 1 rows and returns limit: the one more says whether
# there is a next page (else the last page offered "Next" to an empty one).
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
local ref_part, code, search = ARGV[9], ARGV[10], ARGV[12]

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
  local j = 12 + (i - 2) * 2
  table.insert(sources, {key = KEYS[i], start = first, offset = 0, done = false, buf = {}, at = 1,
    state = ARGV[j - 1], whole = ARGV[j] == '1', size = math.min(chunk, limit + 2), front = nil})
  -- all of an index up to the cursor is behind us: its front starts there
  if has_after then sources[#sources].front = {after_score, after_ref, ARGV[2]} end
end

-- Does an index entry pass the filters on its member (the ref)? The rest (its
-- state, its code) needs its record, read only for the entries a page takes.
local function keep(s, ref)
  if ref_part ~= '' and not string.find(ref, ref_part, 1, true) then return false end
  if search ~= '' and not s.whole and not string.find(ref, search, 1, true) then return false end
  return true
end

local examined = 0

-- The next chunk of one index: from where the last one ended (its score, and how
-- many entries at exactly that score were read), keeping entries past the cursor
-- that pass `keep`. `front`: the last entry examined, so every entry of the index
-- up to it has been seen. A page's worth first (most indexes a search walks give
-- few rows), then doubling, never far past the budget.
local function fetch(s)
  local r
  local size = math.max(1, math.min(s.size, scan_budget - examined))
  s.size = math.min(chunk, s.size * 2)
  if newest then
    r = redis.call('ZRANGE', s.key, s.start, far, 'BYSCORE', 'REV', 'LIMIT', s.offset, size,
      'WITHSCORES')
  else
    r = redis.call('ZRANGE', s.key, s.start, far, 'BYSCORE', 'LIMIT', s.offset, size,
      'WITHSCORES')
  end
  local n = #r / 2
  if n < size then s.done = true end
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
  local fs, fr, fraw = nil, nil, nil
  local buf, whole = s.buf, ref_part == '' and (search == '' or s.whole)
  for i = 1, #r, 2 do
    local ref, raw = r[i], r[i + 1]
    local score = tonumber(raw)
    if not has_after or before(after_score, after_ref, score, ref) then
      examined = examined + 1
      fs, fr, fraw = score, ref, raw
      if whole or keep(s, ref) then buf[#buf + 1] = {score, ref, raw} end
    end
  end
  if fs then s.front = {fs, fr, fraw} end
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

-- The merge: the earliest buffered entry is taken once no index that may still
-- hold an earlier one (its buffer empty, its `front` before that entry) is left
-- unread; only those indexes are read on, a chunk each per pass. Out of budget,
-- the page stops at the earliest such front (the wall): every entry before it was
-- examined, so the next page starts there.
-- May this index hold an entry before e (any, with no e) that is not read yet?
local function blocks(s, e)
  if s.at <= #s.buf or s.done then return false end
  local f = s.front
  return f == nil or e == nil or before(f[1], f[2], e[1], e[2])
end

local rows, code_reads, last, budget, stop = {}, 0, nil, false, nil
while #rows <= limit do
  if code_reads >= code_budget then budget = true; break end
  local best = nil
  for _, s in ipairs(sources) do
    if s.at <= #s.buf then
      local e = s.buf[s.at]
      if best == nil or before(e[1], e[2], best.buf[best.at][1], best.buf[best.at][2]) then
        best = s
      end
    end
  end
  local e = best and best.buf[best.at]
  local blocked, blind, wall = false, false, nil
  for _, s in ipairs(sources) do
    if blocks(s, e) then
      blocked = true
      local f = s.front
      if f == nil then blind = true
      elseif wall == nil or before(f[1], f[2], wall[1], wall[2]) then wall = f end
    end
  end
  if blocked then
    -- Out of budget, stop at the wall, if it moved past the cursor: else the next
    -- page would start where this one did (ties at the cursor, a tiny budget).
    local moved = not blind and (not has_after or before(after_score, after_ref, wall[1], wall[2]))
    if examined >= scan_budget and moved then
      budget = true
      stop = wall
      break
    end
    for _, s in ipairs(sources) do
      if blocks(s, e) then fetch(s) end
    end
  elseif e == nil then
    break  -- every index read through
  else
    best.at = best.at + 1
    last = e
    local ref = e[2]
    local f = redis.call('HMGET', OPS .. ref, 'state', 'tool', 'attempt', 'max_attempts',
      'envelope', 'created')
    if f[1] == best.state then  -- else it moved on since the index was read, or expired
      local c, nb = envelope_fields(f[5] or nil)
      local keep_it = true
      if code ~= '' then
        code_reads = code_reads + 1
        keep_it = f[5] ~= false and string.find(f[5], '"' .. code .. '"', 1, true) ~= nil
          and c == code
      end
      if keep_it then
        local due = redis.call('ZSCORE', DUE, ref)
        table.insert(rows, {ref, f[2] or '', e[3], f[3] or '0', f[4] or '0', c, nb, due or '',
          f[1], f[6] or ''})
      end
    end
  end
end
local more = false
if #rows > limit then
  -- the one more row: there is a next page, which starts after the last row given
  table.remove(rows)
  local at = rows[#rows]
  last = {tonumber(at[3]), at[1], at[3]}
  more = true
elseif budget then
  more = true
  if stop then last = stop end
end
local total = nil
if ARGV[11] == '1' then
  total = 0
  local hi = (bound ~= '' and bound) or '+inf'
  for _, s in ipairs(sources) do total = total + redis.call('ZCOUNT', s.key, '-inf', hi) end
end
local out = {rows = rows, more = more, scanned = examined, budget = budget, total = total}
if last then out.last = {last[3], last[2]} end
if #rows == 0 then out.rows = nil end  -- cjson writes an empty table as {}
return cjson.encode(out)
"""


def indexes(tools: list[str], q: ListQuery) -> list[tuple[str, State]]:
    """The (tool, state) indexes a query walks: its state's, or every state's."""
    states = list(State) if q.state is None else [q.state]
    return [(t, st) for t in tools for st in states]


def list_keys(keys: Keys, tools: list[str], q: ListQuery) -> list[str]:
    return [keys.op_prefix, keys.due, *(keys.index(t, st) for t, st in indexes(tools, q))]


def index_args(tools: list[str], q: ListQuery) -> list[str]:
    """Per index walked: its state, and whether its tool matches the search."""
    out: list[str] = []
    for t, st in indexes(tools, q):
        out += [st.value, "1" if q.tool_matches(t) else "0"]
    return out


def merge_cells(raws: list[Any], q: ListQuery) -> OperationPage:
    """Cells mode: the pages one query read in every cell as one page. Pure.

    Positions (score, ref) are a total order in every cell, so the merged walk is
    the cells' rows in that order, up to where the cell that stopped first stopped
    (past it another cell's rows could be missing), at most ``q.limit`` of them; the
    next page starts after the last row it gives, or where that cell stopped."""
    outs = [json.loads(raw) for raw in raws]

    def at(score: Any, ref: Any) -> Position:
        return Position(int(float(score)), str(ref))

    newest = q.walk_newest
    rows = sorted(
        (row for out in outs for row in out.get("rows") or ()),
        key=lambda row: at(row[2], row[0]),
        reverse=newest,
    )
    stops = [at(*out["last"]) for out in outs if out.get("more") and out.get("last")]
    stop = (max(stops) if newest else min(stops)) if stops else None
    if stop is not None:
        rows = [
            row
            for row in rows
            if (at(row[2], row[0]) >= stop if newest else at(row[2], row[0]) <= stop)
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
    """The script's answer as a page (the rows' fields as the script found them).

    A previous page (``q.backward``) was walked back from the cursor: its rows are
    shown in the page's order, its next page is the one the cursor came from."""
    out = json.loads(raw)
    items = [_summary(row, q) for row in out.get("rows") or ()]
    last = out.get("last")
    more = bool(out.get("more"))
    stop = Position(int(float(last[0])), str(last[1])) if more and last else None
    if q.backward:
        items.reverse()
        after = _position(items[-1]) if items else None
        before = _position(items[0]) if items and stop is not None else None
    else:
        after = stop
        before = _position(items[0]) if items and q.after is not None else None
    total = out.get("total")
    return OperationPage(
        items=items,
        next_cursor=None if after is None else encode_cursor(after, q.newest_first),
        prev_cursor=None if before is None else encode_cursor(before, q.newest_first, True),
        total=None if q.filtered or total is None else int(total),
        partial=bool(out.get("budget")) and len(items) < q.limit and more,
        scanned=int(out.get("scanned") or 0),
    )


def _summary(row: list[Any], q: ListQuery) -> OperationSummary:
    ref, tool, score, attempt, max_attempts, code, not_before, due, *more = row
    state, created = (*more, "", "")[:2]
    return OperationSummary(
        operation_ref=ref,
        tool=tool,
        state=State(state) if state else q.state,
        entered_ms=int(float(score)),
        attempt=int(attempt),
        max_attempts=int(max_attempts),
        code=code or None,
        not_before_ms=not_before_ms(not_before),
        due_ms=int(float(due)) if due else None,
        created_ms=int(float(created)) if created else None,
    )


def _position(item: OperationSummary) -> Position:
    return Position(item.entered_ms, item.operation_ref)


def tools_of(q: ListQuery, members: Any) -> list[str]:
    return [q.tool] if q.tool is not None else sorted(as_text(t) for t in members)


def empty_page(q: ListQuery) -> OperationPage:
    return OperationPage(items=[], next_cursor=None, total=None if q.filtered else 0)
