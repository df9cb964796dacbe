"""The ledger's Lua: every transition is one atomic call of one of these scripts.

**One library, loaded once.** The scripts are the functions of one Lua library
(:func:`library`, named by a hash of its code so that two toolq versions never
replace each other's). A server with functions (Redis >= 7, Valkey) loads it
once (``FUNCTION LOAD``) and runs a call as ``FCALL``: the prelude below (the
state tables, the helpers) is evaluated at load, not on every call. A server
without functions runs the same code as a script (:func:`script`, ``EVALSHA``),
where the prelude runs on every call. Measured on Valkey 9.1 (bench/RESULTS.md,
"Server cost"): the prelude cost ~5-10 µs of server time per script call.

**Keys.** Every script declares the keys it touches in KEYS, named by
:class:`toolq.keys.Keys` and so all under one hash tag (one Cluster slot):

- ``KEYS[1..6]`` of every script, in :func:`fixed_keys` order: the due set, the
  scheduler's wake list and ``sleep_until``, the stats hash, the tools set, and
  the state-index prefix;
- then the script's own: SUBMIT and CLAIM the operation's record (SUBMIT also
  the queue it pushes to), RENEW one record per lease, APPLY one record per item
  and then the queues its items push to, CLAIM_DUE the record prefix.

**History.** An operation's transitions are fields of its record: ``h1``,
``h2``, ... (JSON, :class:`toolq.record.HistoryEntry`), and ``hn``, how many.
Appending one is two more fields in the write the transition makes anyway, and
retention expires one key: as a list of its own the history cost every call
four more commands (three RPUSH, one EXPIRE; bench/RESULTS.md, "Server cost").

Two exceptions, on purpose:

- Keys a script can only name from data it reads are built in Lua from a
  tagged prefix passed in KEYS: the per-tool-per-state indexes (the tool and
  the current state are read from the record; ``IDX .. tool .. ':' .. state``)
  and, in CLAIM_DUE, the records of the refs it finds in the due set. The
  prefix carries the tag, so these keys land in the same slot as the rest.
- The Celery queue lists SUBMIT and APPLY ``LPUSH`` to are kombu's keys, named
  by the queue settings: they cannot carry the tag. They are declared in KEYS
  all the same; a Redis Cluster would refuse a script that pushes (CROSSSLOT).

**Outbox mode** (``broker_url`` set: the broker is not the ledger's Redis). The
scripts ``XADD`` each message, with its queue's name, to the ledger's outbox
stream (:attr:`toolq.keys.Keys.outbox`, tagged, declared in KEYS where the
queue would be) instead of pushing it: the transition and the intent to publish
stay one atomic step, and a relay (:mod:`toolq.relay`) publishes. The queue's
name comes as an argument (SUBMIT's last, APPLY's ``push_name`` blob); without
it a script pushes as before, with the same commands.

ARGV[1] is always the notify channel (a channel, not a key; the steps channel is
derived from it, as :attr:`toolq.keys.Keys.notify_steps` says). Time is passed in
by the caller (ms), so the scripts are deterministic and the clock injectable.

**States.** The state machine is :data:`toolq.states.ALLOWED`, rendered into the
prelude with ``SETTLED`` and ``INITIAL`` (one source, see :func:`lua_tables`):
SUBMIT creates only in an initial state, CLAIM's queued -> running and every
APPLY move go through ``allowed()``, and a quiet APPLY item (a field update)
must stay in the state it finds.

**Cheap on the server.** The server runs every call of every client, so the Lua
does as little as it can: no JSON decoding of arguments (APPLY's items come as
flat arguments, :data:`ITEM_HEAD`), history entries written as strings rather
than through cjson, no table built that a call does not use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from toolq.keys import STEPS_SUFFIX, Keys
from toolq.states import ALLOWED, INITIAL, SETTLED, State

#: The Lua names of KEYS[1..n], the keys every script receives first.
FIXED = ("DUE", "WAKE", "SLEEP", "STATS", "TOOLS", "IDX")

#: The longest a scheduler plans to sleep (ms), whatever ``max_sleep`` says: scripts
#: adding an item due further than this from their ``now`` need not look whether it
#: must wake the scheduler (see ``wake_for``).
WAKE_HORIZON_MS = 10_000

#: The scripts, by the name callers use (the function is ``<library>_<name>``).
NAMES = ("submit", "claim", "renew", "apply", "claim_due", "plan_sleep", "cell_lease")


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
    f"local STEPS_SUFFIX = '{STEPS_SUFFIX}'\n"
    + f"local NFIXED = {len(FIXED)}\n"
    + f"local HORIZON = {WAKE_HORIZON_MS}\n"
    + lua_tables()
    + f"local NOTIFY, {', '.join(FIXED)}\n"
    + r"""local sleeping_until, B, DIRECT, NOW

-- Every call starts here: what the previous call left in these is not this one's.
local function begin(keys, args)
  NOTIFY = args[1]
  DUE, WAKE, SLEEP, STATS, TOOLS, IDX = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
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
-- from the notice itself (toolq.notify) instead of reading the record again; seq is
-- the index of the history entry (where a stream resumes).
local function notify(state, ref, rev, seq, envelope)
  redis.call('SPUBLISH', SETTLED[state] and NOTIFY or NOTIFY .. STEPS_SUFFIX,
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
-- A history entry (toolq.record.HistoryEntry), the value of field 'h' .. n of the
-- record. Built as a string: at and attempt are whole numbers, the states are names.
local function entry(at, from, to, attempt, by, code)
  local head = '{"at":' .. at
  if from then head = head .. ',"from":"' .. from .. '"' end
  local tail = code and (',"code":' .. jstr(code) .. '}') or '}'
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
-- worker's own ack is bookkeeping only (toolq.broker.transport.QoS).
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
)


# Create an operation, or answer for the one that holds its ref (writing nothing).
# KEYS: fixed, op[, queue]  ARGV: notify ref tool args fp call_id now max_attempts
#   deadline state due msg [qname]  (the queue is a key only when msg is not empty;
#   in outbox mode it is the outbox and qname the queue's name)
SUBMIT = r"""
local key, queue = KEYS[NFIXED + 1], KEYS[NFIXED + 2]
local ref, tool, args, fp, call_id = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now, max_attempts, deadline = ARGV[7], ARGV[8], ARGV[9]
local state, due, msg = ARGV[10], tonumber(ARGV[11]), ARGV[12]
NOW = tonumber(now)
if not INITIAL[state] then
  return redis.error_reply('toolq: an operation is never created ' .. state)
end
local cur = redis.call('HMGET', key, 'submit_fp', 'state', 'tool')
if cur[2] then
  if cur[1] == fp and cur[3] == tool then
    -- The same submit again (a retry after a lost reply, maybe on a new connection):
    -- write, unchanged, so that the WAITAOF/WAIT after it on this connection cover
    -- the first write too (they count this connection's writes; replication is ordered).
    redis.call('HSET', key, 'submit_fp', fp)
    return {'exists', cur[2]}
  end
  return {'conflict', cur[2]}
end
local attempt = 0
if state == 'queued' then attempt = 1 end
redis.call('HSET', key, 'ref', ref, 'tool', tool, 'args', args, 'fp', fp, 'submit_fp', fp,
  'call_id', call_id, 'state', state, 'attempt', attempt, 'max_attempts', max_attempts,
  'deadline', deadline, 'created', now, 'updated', now, 'entered', now, 'rev', 1,
  'vcheck', 0, 'vfail', 0, 'repubs', 0, 'published', (msg ~= '' and now) or 0,
  'hn', 1, 'h1', entry(now, nil, state, attempt, 'submit'))
if msg ~= '' then push(queue, msg, ARGV[13]) end
redis.call('ZADD', idxkey(tool, state), now, ref)
set_due(ref, due)
-- The tool joins the tools set with its first submit (its counter's first 1), not
-- with every one: the set only ever grows, and nothing else removes from it.
if redis.call('HINCRBY', STATS, tool .. '|submitted', 1) == 1 then
  redis.call('SADD', TOOLS, tool)
end
if attempt > 0 then stat(tool, 'attempts') end
notify(state, ref, 1, 1)
return {'created', state}
"""

# Claim an attempt (kind=run: queued -> running) or a verification check (kind=verify).
# KEYS: fixed, op[, unacked, unacked index]  ARGV: notify ref attempt holder now lease_ms
#   kind vcheck[ delivery_tag]
# With a delivery tag, an answer other than 'claimed' acknowledges the delivery (the
# body ends there, or records with APPLY, which acknowledges it again: harmless).
CLAIM = r"""
local function claim_one(key, ref, attempt, holder, at, now, lease, kind, vcheck)
local f = redis.call('HMGET', key, 'state', 'attempt', 'lease_holder', 'lease_until', 'tool',
  'args', 'call_id', 'fp', 'approved_fp', 'vcheck', 'max_attempts', 'deadline',
  'uncertain_at', 'vfail', 'vholder', 'vlease_until', 'created', 'rev', 'hn')
local state = f[1]
if not state then return {'missing'} end
local tool = f[5]
if kind == 'run' then
  if state == 'queued' and allowed(state, 'running') and tonumber(f[2]) == attempt then
    local rev, seq = (tonumber(f[18]) or 0) + 1, (tonumber(f[19]) or 0) + 1
    redis.call('HSET', key, 'state', 'running', 'lease_holder', holder,
      'lease_until', now + lease, 'entered', at, 'updated', at, 'rev', rev,
      'hn', seq, 'h' .. seq, entry(at, state, 'running', f[2], holder))
    redis.call('ZREM', idxkey(tool, state), ref)
    redis.call('ZADD', idxkey(tool, 'running'), at, ref)
    set_due(ref, now + lease)
    notify('running', ref, rev, seq)
  elseif state == 'running' and tonumber(f[2]) == attempt then
    -- Ours already (a retried call after a lost reply): the claim stands.
    if f[3] ~= holder then
      stat(tool, 'duplicates_prevented')
      return {'held', f[3] or '', f[4] or '0', tool, f[10], f[11], f[7] or ''}
    end
    -- Renewed: a write, so that the waits after this call (WAITAOF/WAIT, which count
    -- this connection's writes) cover the first claim's too, sent on another connection.
    redis.call('HSET', key, 'lease_until', now + lease)
    set_due(ref, now + lease)
  else
    stat(tool, 'duplicates_prevented')
    return {'stale', state}
  end
elseif state == 'verifying' and tonumber(f[2]) == attempt and tonumber(f[10]) == vcheck then
  if f[15] and f[15] ~= '' and f[15] ~= holder and tonumber(f[16] or '0') > now then
    return {'held', f[15], f[16]}
  end
  redis.call('HSET', key, 'vholder', holder, 'vlease_until', now + lease, 'vclaimed', at)
  set_due(ref, now + lease)
else
  return {'stale', state}
end
return {'claimed', tool, f[6], f[7] or '', f[8], f[9] or '', f[10], f[11], f[12],
  f[13] or '0', f[14], f[17], f[2]}
end

local key = KEYS[NFIXED + 1]
local ref, attempt, holder = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local at, lease, kind, vcheck = ARGV[5], tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local now = tonumber(at)
NOW = now
local out = claim_one(key, ref, attempt, holder, at, now, lease, kind, vcheck)
if out[1] ~= 'claimed' then ack(ARGV[9], KEYS[NFIXED + 2], KEYS[NFIXED + 3]) end
return out
"""


# Renew leases (no state change). KEYS: fixed, then one op per lease, in order.
# ARGV: notify now lease_ms [ref attempt kind holder]...
RENEW = r"""
local now, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
NOW, DIRECT = now, #ARGV == 7
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

#: An APPLY item's fixed part, in this order (then its lists, see :data:`APPLY`).
ITEM_HEAD = (
    "ref", "to", "by", "code", "quiet", "attempt_incr", "envelope", "due", "push_queue",
    "push_message", "push_name", "ttl",
)  # fmt: skip

# Apply a batch of compare-and-set transitions.
# KEYS: fixed, then the op of item 1, of item 2, ..., then the queues pushed to[, then
# kombu's unacked hash and index when the array ends with a delivery tag to acknowledge].
# ARGV: notify now items blob...  where items is one flat JSON array: the number of
# items, then each item's ITEM_HEAD fields (code and ttl false for none; quiet a
# boolean; attempt_incr 0 for none; envelope and push_message blob numbers, 0 for
# none, blob k being ARGV[3 + k]; push_queue a KEYS index (in outbox mode the outbox's)
# and push_name the blob of the queue's name (0 but in outbox mode); due false for
# none, -1 to remove), then its four counted lists: states [n, s...], expect [n, (state_or_*,
# field, value)...], set [n, (field, value)...], del [n, field...], stats [n, name...];
# after the last item, optionally the Celery delivery tag the call acknowledges.
# Flat, not nested objects: cjson built a table per object in the server, and
# one argument, not one per field: redis-py packs every argument in Python (~0.75 µs
# each), which cost the worker more than cjson cost the server (bench/RESULTS.md).
# An item is refused (its answer is the current state) unless the record is in one of
# its states, its expected fields hold, and it moves as ALLOWED says (a quiet item: it
# stays in the state it finds).
APPLY = r"""
local now = ARGV[2]
NOW = tonumber(now)
local A = cjson.decode(ARGV[3])
local out = {}
local p = 2
DIRECT = A[1] == 1
for i = 1, A[1] do
  local ref, to, by, code, quiet = A[p], A[p + 1], A[p + 2], A[p + 3], A[p + 4]
  local incr, envi, due, pushq, pushm, pushn, ttl = A[p + 5], A[p + 6], A[p + 7], A[p + 8],
    A[p + 9], A[p + 10], A[p + 11]
  p = p + 12
  local nstates = A[p]; local states = p + 1; p = states + nstates
  local nexpect = A[p]; local expect = p + 1; p = expect + 3 * nexpect
  local nset = A[p]; local set = p + 1; p = set + 2 * nset
  local ndel = A[p]; local del = p + 1; p = del + ndel
  local nstats = A[p]; local stats = p + 1; p = stats + nstats
  local key = KEYS[NFIXED + i]
  -- one read: the fields every transition needs, then those its guards name
  local names = {'state', 'tool', 'attempt', 'rev', 'hn'}
  for j = 0, nexpect - 1 do names[6 + j] = A[expect + 3 * j + 1] end
  local cur = redis.call('HMGET', key, unpack(names))
  local state = cur[1]
  if not state then
    out[i] = 'missing'
  else
    local ok = false
    for j = states, states + nstates - 1 do if A[j] == state then ok = true end end
    if quiet then
      if to ~= state then ok = false end
    elseif not allowed(state, to) then
      ok = false
    end
    for j = 0, nexpect - 1 do
      local which = A[expect + 3 * j]
      if (which == '*' or which == state) and (cur[6 + j] or '') ~= A[expect + 3 * j + 2] then
        ok = false
      end
    end
    if not ok then
      out[i] = state
    else
      local tool = cur[2]
      local attempt = tonumber(cur[3])
      if incr > 0 then attempt = attempt + incr end
      local rev = (tonumber(cur[4]) or 0) + 1
      local fields = {'updated', now, 'attempt', attempt, 'rev', rev}
      local seq
      if not quiet then
        seq = (tonumber(cur[5]) or 0) + 1
        fields[7] = 'state'; fields[8] = to; fields[9] = 'hn'; fields[10] = seq
        fields[11] = 'h' .. seq; fields[12] = entry(now, state, to, attempt, by, code or nil)
        if to ~= state then fields[13] = 'entered'; fields[14] = now end
      end
      for j = set, set + 2 * nset - 1 do fields[#fields + 1] = A[j] end
      local envelope = envi > 0 and ARGV[3 + envi] or nil
      if envelope then fields[#fields + 1] = 'envelope'; fields[#fields + 1] = envelope end
      if pushq > 0 then fields[#fields + 1] = 'published'; fields[#fields + 1] = now end
      -- The record first: the one write that can fail on what the caller sent. A call
      -- about one operation writes the rest at once (DIRECT), and a message pushed or
      -- an index moved before a failed HSET would stay, for a record that never moved.
      redis.call('HSET', key, unpack(fields))
      if ndel > 0 then redis.call('HDEL', key, unpack(A, del, del + ndel - 1)) end
      if incr > 0 then bstat(tool, 'attempts', incr) end
      if not quiet and to ~= state then bmove(ref, tool, state, to, now) end
      if pushq > 0 then
        bpush(KEYS[pushq], ARGV[3 + pushm], pushn > 0 and ARGV[3 + pushn] or nil)
      end
      if due then
        if due < 0 then bdue(ref, false) else bdue(ref, due, true) end
      end
      for j = stats, stats + nstats - 1 do bstat(tool, A[j]) end
      if ttl then redis.call('EXPIRE', key, ttl) end
      if seq then notify(to, ref, rev, seq, envelope) end
      out[i] = 'ok'
    end
  end
end
-- A worker's record of the delivery it serves acknowledges that delivery (see CLAIM).
if A[p] then ack(A[p], KEYS[#KEYS - 1], KEYS[#KEYS]) end
flush()
return out
"""

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
    r"""
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
# most max_ms away, and never past HORIZON) and record it, so that scripts adding
# an earlier item wake it.
# KEYS: fixed  ARGV: notify now max_ms  ->  the planned wake-up (ms)
PLAN_SLEEP = r"""
local now, max_ms = tonumber(ARGV[2]), math.min(tonumber(ARGV[3]), HORIZON)
redis.call('DEL', WAKE)
local wake_at = now + max_ms
local first = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
if first[2] ~= nil and tonumber(first[2]) < wake_at then wake_at = tonumber(first[2]) end
redis.call('SET', SLEEP, wake_at)
return wake_at
"""

#: Cells mode: a scheduler's lease on a cell (``Keys.cell_lease``, the one key after the
#: fixed ones). ``hold`` takes a free (or expired) lease or renews its own: 1 if held
#: now, 0 if another holds it; ``release`` gives its own up. ARGV: notify, holder,
#: ttl ms, hold|release.
CELL_LEASE = r"""
local key, holder, ttl = KEYS[NFIXED + 1], ARGV[2], tonumber(ARGV[3])
local current = redis.call('GET', key)
if ARGV[4] == 'release' then
  if current == holder then redis.call('DEL', key) end
  return 0
end
if current and current ~= holder then return 0 end
redis.call('SET', key, holder, 'PX', ttl)
return 1
"""

_BODIES = {
    "submit": SUBMIT,
    "claim": CLAIM,
    "renew": RENEW,
    "apply": APPLY,
    "claim_due": CLAIM_DUE,
    "plan_sleep": PLAN_SLEEP,
    "cell_lease": CELL_LEASE,
}


def _function(name: str) -> str:
    """A script as a Lua function of (KEYS, ARGV) that starts from :func:`begin`."""
    return f"local function {name}(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{_BODIES[name]}end\n"


#: The library's name: its code's hash, so that servers shared by two toolq versions
#: hold both libraries instead of one replacing the other's functions mid-deployment.
LIBRARY = (
    "toolq_"
    + hashlib.sha256((PRELUDE + "".join(_function(n) for n in NAMES)).encode()).hexdigest()[:12]
)


def function_name(name: str) -> str:
    """What ``FCALL`` names: the library's function for script ``name``."""
    return f"{LIBRARY}_{name}"


def library() -> str:
    """The code ``FUNCTION LOAD`` takes: the prelude once, then every script as a function."""
    parts = [f"#!lua name={LIBRARY}\n", PRELUDE]
    for name in NAMES:
        parts.append(_function(name))
        parts.append(f"redis.register_function('{function_name(name)}', {name})\n")
    return "".join(parts)


def script(name: str) -> str:
    """Script ``name`` for ``EVAL``/``EVALSHA``, on a server without functions."""
    return PRELUDE + _function(name) + f"return {name}(KEYS, ARGV)\n"
