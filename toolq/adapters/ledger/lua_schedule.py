"""The Lua of the scheduler's calls: CLAIM_DUE, PLAN_SLEEP and CELL_LEASE (assembled
into the library by :mod:`toolq.adapters.ledger.scripts`; called by
:mod:`toolq.adapters.ledger.schedule`).
"""

from __future__ import annotations

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
    "dep_held",
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
