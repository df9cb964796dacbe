"""The prelude of the ledger's Lua: the state tables, the shared state of a call and
the helpers every script uses (see :mod:`toolq.adapters.ledger.scripts`). Evaluated once
where the server has functions, on every call where it runs scripts.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolq.adapters.ledger.lua_deps import DEPS_LUA
from toolq.core.keys import STEPS_SUFFIX
from toolq.core.states import ALLOWED, INITIAL, PENDING_RECOVERY, SETTLED, State
from toolq.core.stats import INF, RECOVERY_BUCKETS_MS, RECOVERY_PREFIX, SUM

#: The Lua names of KEYS[1..n], the keys every script receives first.
FIXED = ("DUE", "WAKE", "SLEEP", "STATS", "TOOLS", "IDX", "DEP")

#: The longest a scheduler plans to sleep (ms), whatever ``max_sleep`` says: scripts
#: adding an item due further than this from their ``now`` need not look whether it
#: must wake the scheduler (see ``wake_for``).
WAKE_HORIZON_MS = 10_000


def _lua_set(states: Iterable[State]) -> str:
    # Enum order, not set order: the script text (and so its SHA) must not vary
    # between processes with different string hash seeds.
    members = frozenset(states)
    return "{" + ", ".join(f"['{s.value}'] = true" for s in State if s in members) + "}"


def lua_tables() -> str:
    """``SETTLED``, ``INITIAL`` and ``ALLOWED`` from :mod:`toolq.core.states`, as Lua tables."""
    allowed = ",\n  ".join(f"['{s.value}'] = {_lua_set(ALLOWED[s])}" for s in State)
    return (
        f"local SETTLED = {_lua_set(SETTLED)}\n"
        f"local INITIAL = {_lua_set(INITIAL)}\n"
        f"local ALLOWED = {{\n  {allowed}\n}}\n"
    )


def lua_recovery() -> str:
    """The states whose time APPLY measures, and the buckets (:mod:`toolq.core.stats`)."""
    edges = ", ".join(str(e) for e in RECOVERY_BUCKETS_MS)
    return (
        f"local RECOVERING = {_lua_set(PENDING_RECOVERY)}\n"
        f"local RT_EDGES = {{{edges}}}\n"
        f"local RT_PREFIX, RT_INF, RT_SUM = '{RECOVERY_PREFIX}:', '{INF}', '{SUM}'\n"
    )


PRELUDE = (
    f"local STEPS_SUFFIX = '{STEPS_SUFFIX}'\n"
    + f"local NFIXED = {len(FIXED)}\n"
    + f"local HORIZON = {WAKE_HORIZON_MS}\n"
    + lua_tables()
    + lua_recovery()
    + f"local NOTIFY, {', '.join(FIXED)}\n"
    + r"""local sleeping_until, B, DIRECT, NOW, DEPS

-- Every call starts here: what the previous call left in these is not this one's.
local function begin(keys, args)
  NOTIFY = args[1]
  DUE, WAKE, SLEEP, STATS, TOOLS, IDX = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  -- the dependency keys' prefix (Keys.dep_prefix, '{tag}:dep:'), and Keys.deps beside it
  DEP = keys[7]
  DEPS = string.sub(DEP, 1, #DEP - 1) .. 's'
  sleeping_until, B, DIRECT, NOW = nil, nil, false, nil
end

local function allowed(from, to) return ALLOWED[from] ~= nil and ALLOWED[from][to] == true end
-- Every state entered is announced, one SPUBLISH per transition (quiet updates: none):
-- sharded, to a channel in the cell's own slot, so on a Cluster the notice stays on
-- this node (a classic PUBLISH goes over the cluster bus to every node).
-- Settled states on NOTIFY, which waiters (tq.wait) hear; the others on the steps
-- channel (Keys.notify_steps), which only watchers (tq.aio.watch, event streams)
-- subscribe to, so a process that just waits hears one notice per call.
-- "state ref\nrev seq\nenvelope": a waiter that read an older rev takes the envelope
-- from the notice itself (toolq.adapters.notify) instead of reading the record again; seq is
-- the index of the history entry (where a stream resumes).
-- steps: on the steps channel whatever the state (a quiet update's note: no state entered).
local function notify(state, ref, rev, seq, envelope, steps)
  redis.call('SPUBLISH', (SETTLED[state] and not steps) and NOTIFY or NOTIFY .. STEPS_SUFFIX,
    state .. ' ' .. ref .. '\n' .. rev .. ' ' .. seq .. '\n' .. (envelope or ''))
end
-- The one key name spelled here: the record's tool and state are known only once read.
local function idxkey(tool, state) return IDX .. tool .. ':' .. state end

-- A JSON string. Callers' words (a lease holder, an operator, a code) are plain in
-- practice: quoted as they are, cjson only for the rare one that needs escapes.
local function jstr(s)
  if string.find(s, '[%c"\\]') then return cjson.encode(s) end
  return '"' .. s .. '"'
end
-- A history entry (toolq.core.record.HistoryEntry), the value of field 'h' .. n of the
-- record. Built as a string: at and attempt are whole numbers, the states are names;
-- note, when there is one, is a JSON object the caller encoded (wire.to_wire).
local function entry(at, from, to, attempt, by, code, note)
  local head = '{"at":' .. at
  if from then head = head .. ',"from":"' .. from .. '"' end
  local tail = code and (',"code":' .. jstr(code) .. '}') or '}'
  if note then tail = ',"note":' .. note .. tail end
  return head .. ',"to":"' .. to .. '","attempt":' .. attempt .. ',"by":' .. jstr(by) .. tail
end

-- Put ref in the due set; wake the sleeping scheduler only if it planned to sleep
-- past this item. A scheduler never plans more than HORIZON ms ahead (PLAN_SLEEP),
-- so an item at least that far past the caller's now (a submit's unclaimed check,
-- a claim's lease: most items) cannot be earlier than its wake-up, and is added
-- without reading SLEEP: two commands fewer per call (bench/RESULTS.md).
local function wake_for(ms)
  if NOW ~= nil and ms >= NOW + HORIZON then return end
  if sleeping_until == nil then sleeping_until = tonumber(redis.call('GET', SLEEP) or '0') end
  if sleeping_until > 0 and ms < sleeping_until then
    sleeping_until = ms
    redis.call('SET', SLEEP, ms)
    redis.call('DEL', WAKE)
    redis.call('LPUSH', WAKE, '1')
  end
end
local function set_due(ref, ms)
  wake_for(ms)
  redis.call('ZADD', DUE, ms, ref)
end

-- Acknowledge a Celery delivery in the same step that ends it: what kombu's Redis
-- transport does on ack (its unacked hash and index, passed as KEYS), so that the
-- worker's own ack is bookkeeping only (toolq.adapters.broker.transport.QoS).
local function ack(tag, unacked, index)
  if tag and tag ~= '' then
    redis.call('HDEL', unacked, tag)
    redis.call('ZREM', index, tag)
  end
end

-- A Celery message for queue key `key`: pushed to it as kombu's Redis transport would;
-- in outbox mode (qname: the queue's name) appended to the outbox stream `key` instead.
local function push(key, msg, qname)
  if qname then return redis.call('XADD', key, '*', 'queue', qname, 'message', msg) end
  return redis.call('LPUSH', key, msg)
end

local function stat(tool, name, n)
  redis.call('HINCRBY', STATS, tool .. '|' .. name, n or 1)
end

-- A script that walks many items (APPLY, CLAIM_DUE, RENEW) gathers its writes to
-- shared keys (the due set, the state indexes, the stats hash, the queues) and makes
-- them in flush(), one command per key: per item that is six fewer commands. Nothing
-- reads these keys before the flush, and only each ref's last word counts, so the
-- result is the same. A call about one operation (DIRECT: SUBMIT, CLAIM, and APPLY
-- or RENEW of one item, the worker's calls) writes at once: for one item the buffer
-- saved no command and cost ~15 µs of server time (bench/RESULTS.md, "Server cost").
local function buffer()
  if B == nil then B = {due = {}, idx = {}, stats = {}, push = {}, refs = {}} end
  return B
end
local function touch(b, ref)
  if b.due[ref] == nil and b.idx[ref] == nil then b.refs[#b.refs + 1] = ref end
end
local function bdue(ref, ms, wake)  -- ms false: remove; wake: as set_due does
  if ms and wake then wake_for(ms) end
  if DIRECT then
    if ms then redis.call('ZADD', DUE, ms, ref) else redis.call('ZREM', DUE, ref) end
    return
  end
  local b = buffer()
  touch(b, ref)
  b.due[ref] = ms
end
local function bmove(ref, tool, from, to, score)  -- state index: the first from, the last to
  if DIRECT then
    if from ~= to then redis.call('ZREM', idxkey(tool, from), ref) end
    redis.call('ZADD', idxkey(tool, to), score, ref)
    return
  end
  local b = buffer()
  touch(b, ref)
  local m = b.idx[ref]
  if m then
    m.to = to; m.score = score
  else
    b.idx[ref] = {tool = tool, from = from, to = to, score = score}
  end
end
local function bstat(tool, name, n)
  if DIRECT then return stat(tool, name, n) end
  local s = buffer().stats
  local f = tool .. '|' .. name
  if not s[f] then s[#s + 1] = f; s[f] = 0 end
  s[f] = s[f] + (n or 1)
end
-- An operation of `tool` left pending-recovery `state` after `ms` in it: count it in
-- its bucket and add it to the sum (toolq.core.stats), per tool and state, so any
-- process can read the times from the ledger (not one process's memory).
local function recovery_spent(tool, state, ms)
  if ms < 0 then ms = 0 end
  local le = RT_INF
  for _, e in ipairs(RT_EDGES) do
    if ms <= e then le = string.format('%d', e); break end
  end
  local name = RT_PREFIX .. state .. ':'
  bstat(tool, name .. le)
  bstat(tool, name .. RT_SUM, ms)
end
local function bpush(queue, msg, qname)
  -- XADD takes one entry per command: gathering outbox entries would save nothing.
  if DIRECT or qname then return push(queue, msg, qname) end
  local p = buffer().push
  if not p[queue] then p[#p + 1] = queue; p[queue] = {} end
  local q = p[queue]
  q[#q + 1] = msg
end
local function many(cmd, key, args)
  for i = 1, #args, 1000 do redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args))) end
end
local function put(t, key, a, b)  -- t[key] gets a (and b): the arguments of one command
  local l = t[key]
  if not l then l = {}; t[key] = l; t[#t + 1] = key end
  l[#l + 1] = a
  if b ~= nil then l[#l + 1] = b end
end
local function flush()
  local b = B
  if b == nil then return end
  local add, rem = {}, {}
  for _, ref in ipairs(b.refs) do
    local ms = b.due[ref]
    if ms then put(add, DUE, ms, ref) elseif ms == false then put(rem, DUE, ref) end
    local m = b.idx[ref]
    if m then
      if m.from ~= m.to then put(rem, idxkey(m.tool, m.from), ref) end
      put(add, idxkey(m.tool, m.to), m.score, ref)
    end
  end
  for _, key in ipairs(rem) do many('ZREM', key, rem[key]) end
  for _, key in ipairs(add) do many('ZADD', key, add[key]) end
  for _, f in ipairs(b.stats) do redis.call('HINCRBY', STATS, f, b.stats[f]) end
  for _, q in ipairs(b.push) do many('LPUSH', q, b.push[q]) end
end
"""
    + DEPS_LUA
)
