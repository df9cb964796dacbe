"""The ledger's Lua scripts: every transition is one atomic script call.

**Keys.** Every script declares the keys it touches in KEYS, named by
:class:`toolq.keys.Keys` and so all under one hash tag (one Cluster slot):

- ``KEYS[1..6]`` of every script, in :func:`fixed_keys` order: the due set, the
  scheduler's wake list and ``sleep_until``, the stats hash, the tools set, and
  the state-index prefix;
- then the script's own: SUBMIT and CLAIM the operation's record and history
  (SUBMIT also the queue it pushes to), RENEW one record per lease, APPLY one
  record and history per item and then the queues its items push to, CLAIM_DUE
  the record prefix.

Two exceptions, on purpose:

- Keys a script can only name from data it reads are built in Lua from a
  tagged prefix passed in KEYS: the per-tool-per-state indexes (the tool and
  the current state are read from the record; ``IDX .. tool .. ':' .. state``)
  and, in CLAIM_DUE, the records of the refs it finds in the due set. The
  prefix carries the tag, so these keys land in the same slot as the rest.
- The Celery queue lists SUBMIT and APPLY ``LPUSH`` to are kombu's keys, named
  by the queue settings: they cannot carry the tag. They are declared in KEYS
  all the same. Until the scale-out issue moves these pushes behind an outbox
  (so that a script writes only its own slot), a Redis Cluster would refuse a
  script that pushes (CROSSSLOT).

ARGV[1] is always the notify channel (a channel, not a key; the steps channel is
derived from it, as :attr:`toolq.keys.Keys.notify_steps` says). Time is passed in
by the caller (ms), so the scripts are deterministic and the clock injectable.

**States.** The state machine is :data:`toolq.states.ALLOWED`, rendered into the
prelude with ``SETTLED`` and ``INITIAL`` (one source, see :func:`lua_tables`):
SUBMIT creates only in an initial state, CLAIM's queued -> running and every
APPLY move go through ``allowed()``, and a quiet APPLY item (a field update)
must stay in the state it finds.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolq.keys import STEPS_SUFFIX, Keys
from toolq.states import ALLOWED, INITIAL, SETTLED, State

#: The Lua names of KEYS[1..n], the keys every script receives first.
FIXED = ("DUE", "WAKE", "SLEEP", "STATS", "TOOLS", "IDX")


def fixed_keys(keys: Keys) -> list[str]:
    """The keys behind :data:`FIXED`, in its order (the contract tests check the pairing)."""
    return [keys.due, keys.wake, keys.sleep_until, keys.stats, keys.tools, keys.index_prefix]


def _lua_set(states: Iterable[State]) -> str:
    # Enum order, not set order: the script text (and so its SHA) must not vary
    # between processes with different string hash seeds.
    members = frozenset(states)
    return "{" + ", ".join(f"['{s.value}'] = true" for s in State if s in members) + "}"


def lua_tables() -> str:
    """``SETTLED``, ``INITIAL`` and ``ALLOWED`` from :mod:`toolq.states`, as Lua tables."""
    allowed = ",\n  ".join(f"['{s.value}'] = {_lua_set(ALLOWED[s])}" for s in State)
    return (
        f"local SETTLED = {_lua_set(SETTLED)}\n"
        f"local INITIAL = {_lua_set(INITIAL)}\n"
        f"local ALLOWED = {{\n  {allowed}\n}}\n"
    )


PRELUDE = (
    "local NOTIFY = ARGV[1]\n"
    + f"local STEPS_SUFFIX = '{STEPS_SUFFIX}'\n"
    + f"local {', '.join(FIXED)} = "
    + ", ".join(f"KEYS[{i}]" for i in range(1, len(FIXED) + 1))
    + f"\nlocal NFIXED = {len(FIXED)}\n"
    + lua_tables()
    + r"""
local function allowed(from, to) return ALLOWED[from] ~= nil and ALLOWED[from][to] == true end
-- Every state entered is announced, one PUBLISH per transition (quiet updates: none).
-- Settled states on NOTIFY, which waiters (tq.wait) hear; the others on the steps
-- channel (Keys.notify_steps), which only watchers (tq.aio.watch, event streams)
-- subscribe to, so a process that just waits hears one notice per call.
-- "state ref\nrev seq\nenvelope": a waiter that read an older rev takes the envelope
-- from the notice itself (toolq.notify) instead of reading the record again; seq is
-- the index of the history entry (where a stream resumes).
local function notify(state, ref, rev, seq, envelope)
  redis.call('PUBLISH', SETTLED[state] and NOTIFY or NOTIFY .. STEPS_SUFFIX,
    state .. ' ' .. ref .. '\n' .. rev .. ' ' .. seq .. '\n' .. (envelope or ''))
end
-- The one key name spelled here: the record's tool and state are known only once read.
local function idxkey(tool, state) return IDX .. tool .. ':' .. state end

-- Put ref in the due set; wake the sleeping scheduler only if it planned to sleep
-- past this item (most items, leases and unclaimed checks, lie beyond its wake-up).
local sleeping_until = nil
local function wake_for(ms)
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

local function stat(tool, name, n)
  redis.call('HINCRBY', STATS, tool .. '|' .. name, n or 1)
end

local function history(hkey, entry)  -- the entry's 1-based index
  return redis.call('RPUSH', hkey, cjson.encode(entry))
end

-- A script that walks many items (APPLY, CLAIM_DUE, RENEW) gathers its writes to
-- shared keys (the due set, the state indexes, the stats hash, the queues) and makes
-- them in flush(), one command per key: per item that is six fewer commands. Nothing
-- reads these keys before the flush, and only each ref's last word counts, so the
-- result is the same. Scripts about one operation write directly (set_due, stat).
local B = {due = {}, idx = {}, stats = {}, push = {}, refs = {}}
local function touch(ref)
  if B.due[ref] == nil and B.idx[ref] == nil then table.insert(B.refs, ref) end
end
local function bdue(ref, ms, wake)  -- ms false: remove; wake: as set_due does
  touch(ref)
  if ms and wake then wake_for(ms) end
  B.due[ref] = ms
end
local function bmove(ref, tool, from, to, score)  -- state index: the first from, the last to
  touch(ref)
  local m = B.idx[ref]
  if m then
    m.to = to; m.score = score
  else
    B.idx[ref] = {tool = tool, from = from, to = to, score = score}
  end
end
local function bstat(tool, name, n)
  local f = tool .. '|' .. name
  if not B.stats[f] then table.insert(B.stats, f); B.stats[f] = 0 end
  B.stats[f] = B.stats[f] + (n or 1)
end
local function bpush(queue, msg)
  if not B.push[queue] then table.insert(B.push, queue); B.push[queue] = {} end
  table.insert(B.push[queue], msg)
end
local function many(cmd, key, args)
  for i = 1, #args, 1000 do redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args))) end
end
local function flush()
  local add, rem = {}, {}
  local function put(t, key, ...)
    if not t[key] then t[key] = {} end
    for _, v in ipairs({...}) do table.insert(t[key], v) end
  end
  for _, ref in ipairs(B.refs) do
    local ms = B.due[ref]
    if ms then put(add, DUE, ms, ref) elseif ms == false then put(rem, DUE, ref) end
    local m = B.idx[ref]
    if m then
      if m.from ~= m.to then put(rem, idxkey(m.tool, m.from), ref) end
      put(add, idxkey(m.tool, m.to), m.score, ref)
    end
  end
  for key, args in pairs(rem) do if #args > 0 then many('ZREM', key, args) end end
  for key, args in pairs(add) do if #args > 0 then many('ZADD', key, args) end end
  for _, f in ipairs(B.stats) do redis.call('HINCRBY', STATS, f, B.stats[f]) end
  for _, q in ipairs(B.push) do many('LPUSH', q, B.push[q]) end
end
"""
)


# Create an operation, or answer for the one that holds its ref (writing nothing).
# KEYS: fixed, op, history[, queue]  ARGV: notify ref tool args fp call_id now
#   max_attempts deadline state due msg  (the queue is a key only when msg is not empty)
SUBMIT = (
    PRELUDE
    + r"""
local key, hkey, queue = KEYS[NFIXED + 1], KEYS[NFIXED + 2], KEYS[NFIXED + 3]
local ref, tool, args, fp, call_id = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now, max_attempts, deadline = ARGV[7], ARGV[8], ARGV[9]
local state, due, msg = ARGV[10], tonumber(ARGV[11]), ARGV[12]
if not INITIAL[state] then
  return redis.error_reply('toolq: an operation is never created ' .. state)
end
local cur = redis.call('HMGET', key, 'submit_fp', 'state', 'tool')
if cur[2] then
  if cur[1] == fp and cur[3] == tool then return {'exists', cur[2]} end
  return {'conflict', cur[2]}
end
local attempt = 0
if state == 'queued' then attempt = 1 end
redis.call('HSET', key, 'ref', ref, 'tool', tool, 'args', args, 'fp', fp, 'submit_fp', fp,
  'call_id', call_id, 'state', state, 'attempt', attempt, 'max_attempts', max_attempts,
  'deadline', deadline, 'created', now, 'updated', now, 'entered', now, 'rev', 1,
  'vcheck', 0, 'vfail', 0, 'repubs', 0, 'published', (msg ~= '' and now) or 0)
if msg ~= '' then redis.call('LPUSH', queue, msg) end
redis.call('SADD', TOOLS, tool)
redis.call('ZADD', idxkey(tool, state), now, ref)
local seq = history(hkey, {at = tonumber(now), to = state, attempt = attempt, by = 'submit'})
set_due(ref, due)
stat(tool, 'submitted')
if attempt > 0 then stat(tool, 'attempts') end
notify(state, ref, 1, seq)
return {'created', state}
"""
)

# Claim an attempt (kind=run: queued -> running) or a verification check (kind=verify).
# KEYS: fixed, op, history  ARGV: notify ref attempt holder now lease_ms kind vcheck
CLAIM = (
    PRELUDE
    + r"""
local key, hkey = KEYS[NFIXED + 1], KEYS[NFIXED + 2]
local ref, attempt, holder = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, lease, kind, vcheck = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local f = redis.call('HMGET', key, 'state', 'attempt', 'lease_holder', 'lease_until', 'tool',
  'args', 'call_id', 'fp', 'approved_fp', 'vcheck', 'max_attempts', 'deadline',
  'uncertain_at', 'vfail', 'vholder', 'vlease_until', 'created', 'rev')
local state = f[1]
if not state then return {'missing'} end
local tool = f[5]
local body = {'claimed', tool, f[6], f[7] or '', f[8], f[9] or '', f[10], f[11], f[12],
  f[13] or '0', f[14], f[17], f[2]}
if kind == 'run' then
  if state == 'queued' and allowed(state, 'running') and tonumber(f[2]) == attempt then
    local rev = (tonumber(f[18]) or 0) + 1
    redis.call('HSET', key, 'state', 'running', 'lease_holder', holder,
      'lease_until', now + lease, 'entered', now, 'updated', now, 'rev', rev)
    redis.call('ZREM', idxkey(tool, state), ref)
    redis.call('ZADD', idxkey(tool, 'running'), now, ref)
    local seq = history(hkey, {at = now, from = state, to = 'running', attempt = attempt,
      by = holder})
    set_due(ref, now + lease)
    notify('running', ref, rev, seq)
    return body
  end
  if state == 'running' and tonumber(f[2]) == attempt then
    -- Ours already (a retried call after a lost reply): the claim stands.
    if f[3] == holder then return body end
    stat(tool, 'duplicates_prevented')
    return {'held', f[3] or '', f[4] or '0', tool, f[10], f[11], f[7] or ''}
  end
  stat(tool, 'duplicates_prevented')
  return {'stale', state}
end
if state == 'verifying' and tonumber(f[2]) == attempt and tonumber(f[10]) == vcheck then
  if f[15] and f[15] ~= '' and f[15] ~= holder and tonumber(f[16] or '0') > now then
    return {'held', f[15], f[16]}
  end
  redis.call('HSET', key, 'vholder', holder, 'vlease_until', now + lease, 'vclaimed', now)
  set_due(ref, now + lease)
  return body
end
return {'stale', state}
"""
)

# Renew leases (no state change). KEYS: fixed, then one op per lease, in order.
# ARGV: notify now lease_ms [ref attempt kind holder]...
RENEW = (
    PRELUDE
    + r"""
local now, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local lost = {}
local n = 0
for i = 4, #ARGV, 4 do
  n = n + 1
  local key = KEYS[NFIXED + n]
  local ref, attempt, kind, holder = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
  local f = redis.call('HMGET', key, 'state', 'attempt', 'lease_holder', 'vholder')
  if kind == 'run' and f[1] == 'running' and tonumber(f[2]) == attempt and f[3] == holder then
    redis.call('HSET', key, 'lease_until', now + lease)
    bdue(ref, now + lease, true)
  elseif kind == 'verify' and f[1] == 'verifying' and tonumber(f[2]) == attempt
      and f[4] == holder then
    redis.call('HSET', key, 'vlease_until', now + lease)
    bdue(ref, now + lease, true)
  else
    table.insert(lost, ref)
  end
end
flush()
return lost
"""
)

# Apply a batch of compare-and-set transitions.
# KEYS: fixed, then op and history of item 1, of item 2, ..., then the queues pushed to.
# ARGV: notify now items_json blob...
# item: {ref, states=[..], expect={state_or_*: {field: value}}, to, by, code,
#        attempt_incr, set={}, del=[], envelope=ARGV index, due (ms, <0 removes),
#        push=[KEYS index of the queue, ARGV index of the message], stats=[..], ttl, quiet}
# An item is refused (its answer is the current state) unless the record is in one of
# its states, its expected fields hold, and it moves as ALLOWED says (a quiet item: it
# stays in the state it finds).
APPLY = (
    PRELUDE
    + r"""
local now = tonumber(ARGV[2])
local items = cjson.decode(ARGV[3])
local out = {}
for i, it in ipairs(items) do
  local ref = it.ref
  local key, hkey = KEYS[NFIXED + 2 * i - 1], KEYS[NFIXED + 2 * i]
  -- one read: the fields every transition needs, then those its guards name
  local names = {'state', 'tool', 'attempt', 'rev'}
  local wants = {}
  if it.expect then
    for which, want in pairs(it.expect) do
      for field, val in pairs(want) do
        table.insert(names, field)
        table.insert(wants, {which, val})
      end
    end
  end
  local cur = redis.call('HMGET', key, unpack(names))
  local state = cur[1]
  if not state then
    out[i] = 'missing'
  else
    local ok = false
    for _, s in ipairs(it.states) do if s == state then ok = true end end
    if it.quiet then
      if it.to ~= state then ok = false end
    elseif not allowed(state, it.to) then
      ok = false
    end
    for j, w in ipairs(wants) do
      if (w[1] == '*' or w[1] == state) and tostring(cur[4 + j] or '') ~= tostring(w[2]) then
        ok = false
      end
    end
    if not ok then
      out[i] = state
    else
      local tool = cur[2]
      local attempt = tonumber(cur[3])
      if it.attempt_incr and it.attempt_incr > 0 then
        attempt = attempt + it.attempt_incr
        bstat(tool, 'attempts', it.attempt_incr)
      end
      local rev = (tonumber(cur[4]) or 0) + 1
      local fields = {'updated', now, 'attempt', attempt, 'rev', rev}
      if not it.quiet then
        table.insert(fields, 'state'); table.insert(fields, it.to)
        if it.to ~= state then
          table.insert(fields, 'entered'); table.insert(fields, now)
          bmove(ref, tool, state, it.to, now)
        end
      end
      if it.set then
        for k, v in pairs(it.set) do table.insert(fields, k); table.insert(fields, v) end
      end
      local envelope = it.envelope and ARGV[it.envelope]
      if envelope then table.insert(fields, 'envelope'); table.insert(fields, envelope) end
      if it.push then
        bpush(KEYS[it.push[1]], ARGV[it.push[2]])
        table.insert(fields, 'published'); table.insert(fields, now)
      end
      redis.call('HSET', key, unpack(fields))
      if it.del and #it.del > 0 then redis.call('HDEL', key, unpack(it.del)) end
      local seq = nil
      if not it.quiet then
        seq = history(hkey, {at = now, from = state, to = it.to, attempt = attempt, by = it.by,
          code = it.code})
      end
      if it.due then
        if it.due < 0 then bdue(ref, false) else bdue(ref, it.due, true) end
      end
      if it.stats then for _, name in ipairs(it.stats) do bstat(tool, name) end end
      if it.ttl then
        redis.call('EXPIRE', key, it.ttl)
        redis.call('EXPIRE', hkey, it.ttl)
      end
      if seq then notify(it.to, ref, rev, seq, envelope) end
      out[i] = 'ok'
    end
  end
end
flush()
return out
"""
)

#: Fields the scheduler reads to decide what a due operation needs.
DUE_FIELDS = (
    "state",
    "tool",
    "attempt",
    "max_attempts",
    "deadline",
    "lease_holder",
    "lease_until",
    "entered",
    "uncertain_at",
    "vcheck",
    "vfail",
    "vholder",
    "vlease_until",
    "repubs",
    "rev",
    "retry_due",
    "call_id",
    "created",
    "published",
    "vclaimed",
)

# Take up to `limit` due items and hide them from other schedulers for `hold` ms.
# KEYS: fixed, the record prefix (the refs are read from the due set)
# ARGV: notify now limit hold_ms  ->  JSON [[ref, due_score, f1..fn], ...]
# (one string: parsing thousands of reply elements costs more than the script)
CLAIM_DUE = (
    PRELUDE
    + r"""
local OPS = KEYS[NFIXED + 1]
local now, limit, hold = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', DUE, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local out = {}
local fields = {"""
    + ", ".join(f"'{f}'" for f in DUE_FIELDS)
    + r"""}
for i = 1, #due, 2 do
  local ref = due[i]
  local f = redis.call('HMGET', OPS .. ref, unpack(fields))
  if not f[1] then
    bdue(ref, false)
  else
    bdue(ref, now + hold)
    local row = {ref, due[i + 1]}
    for j = 1, #fields do row[j + 2] = f[j] or '' end
    table.insert(out, row)
  end
end
flush()
if #out == 0 then return '[]' end
return cjson.encode(out)
"""
)

# The scheduler is about to sleep: plan the wake-up at the earliest due item (at
# most max_ms away) and record it, so that scripts adding an earlier item wake it.
# KEYS: fixed  ARGV: notify now max_ms  ->  the planned wake-up (ms)
PLAN_SLEEP = (
    PRELUDE
    + r"""
local now, max_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('DEL', WAKE)
local wake_at = now + max_ms
local first = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
if first[2] ~= nil and tonumber(first[2]) < wake_at then wake_at = tonumber(first[2]) end
redis.call('SET', SLEEP, wake_at)
return wake_at
"""
)
