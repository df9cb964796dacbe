"""The Lua of the calls on operations: SUBMIT, CLAIM, RENEW and APPLY (assembled
into the library by :mod:`toolq.adapters.ledger.scripts`; their KEYS and ARGV are built by
:mod:`toolq.adapters.ledger.wire`).
"""

from __future__ import annotations

# Create an operation, or answer for the one that holds its ref (writing nothing but the
# count of repeats, duplicate_submits).
# KEYS: fixed, op[, queue]  ARGV: notify ref tool args fp call_id now max_attempts
#   deadline state due msg extra [qname]  (the queue is a key only when msg is not empty;
#   in outbox mode it is the outbox and qname the queue's name; extra: more record
#   fields, a flat JSON array [field, value, ...], "" for none)
SUBMIT = r"""
local key, queue = KEYS[NFIXED + 1], KEYS[NFIXED + 2]
local ref, tool, args, fp, call_id = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now, max_attempts, deadline = ARGV[7], ARGV[8], ARGV[9]
local state, due, msg, extra = ARGV[10], tonumber(ARGV[11]), ARGV[12], ARGV[13]
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
    stat(tool, 'duplicate_submits')
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
if extra ~= '' then redis.call('HSET', key, unpack(cjson.decode(extra))) end
if msg ~= '' then push(queue, msg, ARGV[14]) end
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
#   kind vcheck limits[ delivery_tag]
# With a delivery tag, an answer other than 'claimed' acknowledges the delivery (the
# body ends there, or records with APPLY, which acknowledges it again: harmless).
# A run whose record has a dependency key (`dep`) is admitted by its key first
# (lua_deps: limits from the worker's table `limits`, "" for none declared): held
# back, it moves queued -> waiting_retry DEPENDENCY_LIMITED and the answer is
# {'limited', reason, not_before, due}. A record without one reads one field more.
CLAIM = r"""
local function claim_one(key, ref, attempt, holder, at, now, lease, kind, vcheck, limits)
local f = redis.call('HMGET', key, 'state', 'attempt', 'lease_holder', 'lease_until', 'tool',
  'args', 'call_id', 'fp', 'approved_fp', 'vcheck', 'max_attempts', 'deadline',
  'uncertain_at', 'vfail', 'vholder', 'vlease_until', 'created', 'rev', 'hn', 'dep', 'dep_slot',
  'dep_held')
local state = f[1]
if not state then return {'missing'} end
local tool = f[5]
if kind == 'run' then
  if state == 'queued' and allowed(state, 'running') and tonumber(f[2]) == attempt then
    if f[20] and f[20] ~= '' then
      local deadline = tonumber(f[12]) or 0
      local why, nb, reserve
      -- past its deadline: claimed, and the worker's budget check escalates it
      if deadline == 0 or now <= deadline then
        why, nb, reserve = dep_admit(f[20], ref, now, lease, dep_limits(limits, f[20]), f[21])
      end
      if why then return dep_hold(key, ref, f[20], f, at, now, why, nb, reserve, holder) end
      -- admitted: its reservation is spent, and it is held no more (an operator's
      -- retry now of a held call keeps the field until here)
      if f[21] or f[22] then redis.call('HDEL', key, 'dep_slot', 'dep_held') end
    end
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
local out = claim_one(key, ref, attempt, holder, at, now, lease, kind, vcheck, ARGV[9])
if out[1] ~= 'claimed' then ack(ARGV[10], KEYS[NFIXED + 2], KEYS[NFIXED + 3]) end
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
  local f = redis.call('HMGET', key, 'state', 'attempt', 'lease_holder', 'vholder', 'dep')
  if kind == 'run' and f[1] == 'running' and tonumber(f[2]) == attempt and f[3] == holder then
    redis.call('HSET', key, 'lease_until', now + lease)
    bdue(ref, now + lease, true)
    if f[5] and f[5] ~= '' then  -- its dependency's slot, and its probe, live as long
      local D = DEP .. f[5]
      redis.call('ZADD', D .. ':slots', 'XX', now + lease, ref)
      if redis.call('HGET', D, 'probe') == ref then
        redis.call('HSET', D, 'probe_until', now + lease)
      end
    end
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
# ARGV: notify now items blob...  where items is one flat JSON array: the number of items,
# then each item's ITEM_HEAD fields (code and ttl false for none; quiet a boolean, or the
# blob number of the history entry's note: positive for a transition, negative for a quiet
# update, which then appends an entry too; attempt_incr 0 for none; envelope and
# push_message blob numbers, 0 for none, blob k being ARGV[3 + k]; push_queue a KEYS index
# (in outbox mode the outbox's) and push_name the blob of the queue's name (0 but in
# outbox mode); due false for none, -1 to remove), then its four counted lists: states [n,
# s...], expect [n, (state_or_*, field, value)...], set [n, (field, value)...], del [n,
# field...], stats [n, name...]; after the last item, optionally the Celery delivery tag
# the call acknowledges.
# Flat, not nested objects: cjson built a table per object in the server, and
# one argument, not one per field: redis-py packs every argument in Python (~0.75 µs
# each), which cost the worker more than cjson cost the server (bench/RESULTS.md).
# An item is refused (its answer is the current state) unless the record is in one of
# its states, its expected fields hold, and it moves as ALLOWED says (a quiet item: it
# stays in the state it finds; with a note it appends a history entry, from == to, and
# announces it on the steps channel only).
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
  local note
  if quiet ~= true and quiet ~= false then
    note = ARGV[3 + math.abs(quiet)]
    quiet = quiet < 0
  end
  local nstates = A[p]; local states = p + 1; p = states + nstates
  local nexpect = A[p]; local expect = p + 1; p = expect + 3 * nexpect
  local nset = A[p]; local set = p + 1; p = set + 2 * nset
  local ndel = A[p]; local del = p + 1; p = del + ndel
  local nstats = A[p]; local stats = p + 1; p = stats + nstats
  local key = KEYS[NFIXED + i]
  -- one read: the fields every transition needs, then those its guards name
  local names = {'state', 'tool', 'attempt', 'rev', 'hn', 'dep'}
  for j = 0, nexpect - 1 do names[7 + j] = A[expect + 3 * j + 1] end
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
      if (which == '*' or which == state) and (cur[7 + j] or '') ~= A[expect + 3 * j + 2] then
        ok = false
      end
    end
    if not ok then
      out[i] = state
    else
      local tool = cur[2]
      -- Leaving a pending-recovery state: how long it took (a call that never enters
      -- recovery reads nothing more).
      local spent
      if not quiet and to ~= state and RECOVERING[state] then
        spent = NOW - (tonumber(redis.call('HGET', key, 'entered')) or NOW)
      end
      local attempt = tonumber(cur[3])
      if incr > 0 then attempt = attempt + incr end
      local rev = (tonumber(cur[4]) or 0) + 1
      local fields = {'updated', now, 'attempt', attempt, 'rev', rev}
      local seq
      if not quiet or note then
        seq = (tonumber(cur[5]) or 0) + 1
        fields[7] = 'state'; fields[8] = to; fields[9] = 'hn'; fields[10] = seq
        fields[11] = 'h' .. seq; fields[12] = entry(now, state, to, attempt, by, code or nil, note)
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
      if spent then recovery_spent(tool, state, spent) end
      -- ttl 0: the record lives again (an escalated operation an operator retried)
      if ttl then
        if ttl > 0 then redis.call('EXPIRE', key, ttl) else redis.call('PERSIST', key) end
      end
      -- Its dependency key (lua_deps): leaving running gives its slot back and tells
      -- the key the outcome (the item's dep_signal, toolq.decisions.deps.signal_of);
      -- leaving a hold (cancelled, escalated) drops it from the key's waiting.
      local dep = cur[6]
      if dep and dep ~= '' and not quiet and to ~= state then
        if state == 'running' then
          local signal
          for j = set, set + 2 * nset - 1, 2 do
            if A[j] == 'dep_signal' then signal = A[j + 1] end
          end
          dep_after(dep, ref, signal, due and due > 0 and due or nil, to == 'succeeded', NOW)
        elseif state == 'waiting_retry' then
          redis.call('ZREM', DEP .. dep .. ':waiting', ref)
        end
      end
      if seq then notify(to, ref, rev, seq, envelope, quiet) end
      out[i] = 'ok'
    end
  end
end
-- A worker's record of the delivery it serves acknowledges that delivery (see CLAIM).
if A[p] then ack(A[p], KEYS[#KEYS - 1], KEYS[#KEYS]) end
flush()
return out
"""
