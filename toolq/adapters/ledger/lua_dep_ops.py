"""The Lua of an operator's actions on a dependency key: DEP_ACT and DEP_DUE (assembled
into the library by :mod:`toolq.adapters.ledger.scripts`; called by
:mod:`toolq.adapters.ledger.dep_state`; what applies when: :mod:`toolq.decisions.dep_actions`).

DEP_ACT settles the key in its own cell, atomically: checks the action applies, writes
it and who, when and why, and answers the refs the key holds back. DEP_DUE then makes
those refs due, in each ref's own cell (on a Cluster a key's cell and its refs' are
different slots): only a ref still ``waiting_retry`` on this key moves, and only earlier.
"""

from __future__ import annotations

from toolq.decisions.dep_actions import CLOSABLE, LOG_CAP

#: The most held-back refs one action makes due (the rest go as the limiter lets them).
MAX_HURRIED = 10_000

_CLOSABLE = "{" + ", ".join(f"['{s}'] = true" for s in sorted(CLOSABLE)) + "}"

# KEYS: fixed, the key's hash, its waiting set
# ARGV: notify now action by why
#   -> {'ok', ref...} | {'unknown'} | {'NOT_PAUSED'} | {'BREAKER_CLOSED'}
DEP_ACT = (
    f"local CLOSABLE = {_CLOSABLE}\n"
    + r"""local DEP, WAITING = KEYS[NFIXED + 1], KEYS[NFIXED + 2]
local now, action, by, why = tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
if redis.call('EXISTS', DEP) == 0 then return {'unknown'} end
local f = redis.call('HMGET', DEP, 'paused_until', 'breaker', 'op_log')
if action == 'lift' then
  if tonumber(f[1] or '0') <= now then return {'NOT_PAUSED'} end
  redis.call('HDEL', DEP, 'paused_until', 'pause_code')
else
  if not CLOSABLE[f[2] or 'closed'] then return {'BREAKER_CLOSED'} end
  redis.call('HSET', DEP, 'breaker', 'closed', 'fails', 0)
  redis.call('HDEL', DEP, 'fails_since', 'open_until', 'probe', 'probe_until')
end
local log = {}
if f[3] then
  local ok, old = pcall(cjson.decode, f[3])
  if ok and type(old) == 'table' then log = old end
end
table.insert(log, 1, {at = now, by = by, what = action, why = why})
"""
    + f"while #log > {LOG_CAP} do table.remove(log) end\n"
    + r"""redis.call('HSET', DEP, 'op_at', now, 'op_by', by, 'op_what', action, 'op_why', why,
  'op_log', cjson.encode(log))
local out = {'ok'}
"""
    + f"local refs = redis.call('ZRANGE', WAITING, 0, {MAX_HURRIED - 1})\n"
    + r"""for i = 1, #refs do out[i + 1] = refs[i] end
return out
"""
)

# KEYS: fixed, the record prefix
# ARGV: notify now key ref1 ms1 ref2 ms2 ...  ->  how many refs it made due earlier
DEP_DUE = r"""
local OPS = KEYS[NFIXED + 1]
NOW = tonumber(ARGV[2])
local key, moved = ARGV[3], 0
for i = 4, #ARGV, 2 do
  local ref, ms = ARGV[i], tonumber(ARGV[i + 1])
  local f = redis.call('HMGET', OPS .. ref, 'state', 'dep', 'retry_due')
  if f[1] == 'waiting_retry' and f[2] == key then
    local earlier = false
    if tonumber(f[3] or '0') > ms then
      redis.call('HSET', OPS .. ref, 'retry_due', ms)
      earlier = true
    end
    local score = redis.call('ZSCORE', DUE, ref)
    if not score or tonumber(score) > ms then
      set_due(ref, ms)
      earlier = true
    end
    if earlier then moved = moved + 1 end
  end
end
return moved
"""
