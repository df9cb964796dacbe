"""The Lua of limits per dependency (issue 28): admission in CLAIM, the slot's renewal
in RENEW, the release, shared backoff and breaker in APPLY. It makes the decisions of
:mod:`toolq.decisions.deps` (same order, same numbers; the contract test drives both)
on the stored layout of :mod:`toolq.core.deps`. Appended to the prelude; only a call
whose record has a ``dep`` reaches any of it: the others pay no command.

A key's state is built from ``DEP`` (:attr:`toolq.core.keys.Keys.dep_prefix`, a fixed
key of every script) and the key read from the record, as the state indexes are.
"""

from __future__ import annotations

import json

from toolq.core.deps import DEFAULT_LIMITS, limits_row
from toolq.core.own_envelopes import (
    DEPENDENCY_LIMITED,
    DEPENDENCY_LIMITED_AGENT,
    DEPENDENCY_LIMITED_USER,
)
from toolq.decisions.deps import RESERVATION_GRACE_MS, RESERVATION_SLACK_MS

#: The envelope's fixed tail (its messages), JSON as the script appends it.
_TEXT = (
    ',"agent_message":'
    + json.dumps(DEPENDENCY_LIMITED_AGENT)
    + ',"user_message":'
    + json.dumps(DEPENDENCY_LIMITED_USER)
    + "}"
)
_DEFAULT = ", ".join(json.dumps(v) for v in limits_row(DEFAULT_LIMITS))

DEPS_LUA = (
    f"local DEP_DEFAULT = {{{_DEFAULT}}}\n"
    f"local DEP_GRACE, DEP_SLACK = {RESERVATION_GRACE_MS}, {RESERVATION_SLACK_MS}\n"
    f"local DEP_CODE = '{DEPENDENCY_LIMITED}'\n"
    f"local DEP_TEXT = [==[{_TEXT}]==]\n"
    + r"""
-- The limits of key `k` from the worker's table (toolq.core.deps.limits_table): the key,
-- else the part before its first ':', else the defaults.
local function dep_limits(raw, k)
  if raw and raw ~= '' then
    local t = cjson.decode(raw)
    if t[k] then return t[k] end
    local head = string.match(k, '^([^:]*):')
    if head and t[head] then return t[head] end
  end
  return DEP_DEFAULT
end

-- ms since the epoch as the envelope's UTC time (2026-01-02T03:04:05.678Z).
local function iso(ms)
  ms = math.floor(ms)
  local s = math.floor(ms / 1000)
  local frac = ms - s * 1000
  local days = math.floor(s / 86400)
  local sod = s - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d,
    math.floor(sod / 3600), math.floor((sod % 3600) / 60), sod % 60, frac)
end

-- toolq.core.own_envelopes.dependency_limited_envelope, as JSON.
local function dep_envelope(ref, tool, call_id, k, reason, nb, left)
  if left < 1 then left = 1 end
  local head = '{"ok":false,"code":"' .. DEP_CODE .. '","category":"dependency",'
    .. '"commit_state":"not_committed","retry":{"directive":"after_delay","not_before":"'
    .. iso(nb) .. '","max_attempts_remaining":' .. string.format('%d', left) .. '},'
    .. '"next_action":"wait_and_retry","operation_ref":' .. jstr(ref)
    .. ',"operation":' .. jstr(tool)
  if call_id and call_id ~= '' then head = head .. ',"call_id":' .. jstr(call_id) end
  return head .. ',"safe_details":{"dependency":' .. jstr(k) .. ',"reason":"' .. reason
    .. '"}' .. DEP_TEXT
end

-- toolq.decisions.deps.admit: nil when the call may run (its slot, probe and the rate's
-- tat written), else reason, not_before[, the slot reserved].
local function dep_admit(k, ref, now, lease, L, slot)
  local D = DEP .. k
  local h = redis.call('HMGET', D, 'tat', 'paused_until', 'breaker', 'open_until', 'probe',
    'probe_until', 'atat', 'resume')
  local paused = tonumber(h[2]) or 0
  if paused > now then return 'paused', paused end
  local breaker = h[3] or 'closed'
  local w = {'rate', L[1], 'burst', L[3], 'concurrency', L[4], 'breaker_failures', L[5],
    'breaker_window_ms', L[6], 'breaker_open_ms', L[7]}
  local probe = false
  if h[8] == '1' then
    -- the pause is over, not yet shown to be: one call tests the key first
    local pu = tonumber(h[6]) or 0
    if h[5] and h[5] ~= '' and h[5] ~= ref and pu > now then return 'paused', pu end
    probe = true
  end
  if breaker == 'open' then
    local ou = tonumber(h[4]) or 0
    if ou > now then return 'breaker_open', ou end
    breaker = 'half_open'
    h[5] = nil
    w[#w + 1] = 'breaker'; w[#w + 1] = 'half_open'
  end
  if breaker == 'half_open' then
    local pu = tonumber(h[6]) or 0
    if h[5] and h[5] ~= '' and h[5] ~= ref and pu > now then return 'half_open', pu end
    probe = true
  end
  local conc = tonumber(L[4]) or 0
  local S = D .. ':slots'
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', S, '-inf', now)
    if redis.call('ZCARD', S) >= conc and not redis.call('ZSCORE', S, ref) then
      local first = redis.call('ZRANGE', S, 0, 0, 'WITHSCORES')
      return 'concurrency', tonumber(first[2])
    end
  end
  local interval = tonumber(L[2]) or 0
  if interval > 0 then
    local s = tonumber(slot or '')
    if s and s > now + DEP_SLACK then return 'rate', s end
    local tau = (tonumber(L[3]) - 1) * interval
    local atat = math.max(tonumber(h[7]) or 0, now)
    if s and s >= now - DEP_GRACE and atat - now <= tau then
      -- its reserved slot: the schedule (tat) does not move
      w[#w + 1] = 'atat'; w[#w + 1] = atat + interval
    else
      local tat = math.max(tonumber(h[1]) or 0, now, atat)
      if tat - now > tau then
        local at = math.floor(tat - tau)
        redis.call('HSET', D, 'tat', tat + interval)
        return 'rate', at, at
      end
      w[#w + 1] = 'tat'; w[#w + 1] = tat + interval
      w[#w + 1] = 'atat'; w[#w + 1] = atat + interval
    end
  end
  if probe then
    w[#w + 1] = 'probe'; w[#w + 1] = ref
    w[#w + 1] = 'probe_until'; w[#w + 1] = now + lease
  end
  redis.call('HSET', D, unpack(w))
  redis.call('HINCRBY', D, 'n_admitted', 1)
  if conc > 0 then redis.call('ZADD', S, now + lease, ref) end
  redis.call('ZREM', D .. ':waiting', ref)
  redis.call('ZADD', DEPS, now, k)
  return nil
end

-- toolq.decisions.deps.hold_due: the spread comes from the ref (no random in a script).
local function dep_due(nb, now, reason, ref, deadline)
  local due = nb
  if reason ~= 'rate' then
    local spread = math.min(5000, math.max(100, math.floor((nb - now) / 5)))
    local h = nb % 16777216
    for i = 1, #ref do h = (h * 31 + string.byte(ref, i)) % 16777216 end
    local frac = h / 16777216
    due = due + math.floor(frac * spread)
  end
  if deadline > 0 and due > deadline + 1 then due = deadline + 1 end
  return due
end

-- Hold a queued call back: waiting_retry, DEPENDENCY_LIMITED, no attempt spent
-- (dep_held: the scheduler's dispatch republishes the same attempt).
-- f: CLAIM's read of the record.
local function dep_hold(key, ref, k, f, at, now, reason, nb, reserve, by)
  local tool = f[5]
  local deadline = tonumber(f[12]) or 0
  local due = dep_due(nb, now, reason, ref, deadline)
  local attempt = tonumber(f[2])
  local env = dep_envelope(ref, tool, f[7], k, reason, nb,
    (tonumber(f[11]) or 1) - attempt + 1)
  local rev, seq = (tonumber(f[18]) or 0) + 1, (tonumber(f[19]) or 0) + 1
  redis.call('HSET', key, 'state', 'waiting_retry', 'entered', at, 'updated', at, 'rev', rev,
    'hn', seq, 'h' .. seq, entry(at, 'queued', 'waiting_retry', f[2], by, DEP_CODE),
    'envelope', env, 'retry_due', due, 'dep_held', reason, 'dep_slot', reserve or f[21] or '')
  redis.call('ZREM', idxkey(tool, 'queued'), ref)
  redis.call('ZADD', idxkey(tool, 'waiting_retry'), at, ref)
  set_due(ref, due)
  local D = DEP .. k
  redis.call('ZADD', D .. ':waiting', due, ref)
  redis.call('HINCRBY', D, (reason == 'rate' or reason == 'concurrency') and 'n_limited'
    or 'n_paused', 1)
  redis.call('ZADD', DEPS, now, k)
  stat(tool, 'dep_limited')
  notify('waiting_retry', ref, rev, seq, env)
  return {'limited', reason, string.format('%d', nb), string.format('%d', due)}
end

-- A call of key k left running (APPLY): its slot back (and the first call the key
-- holds back made due now), then toolq.decisions.deps.after_outcome.
local function dep_after(k, ref, signal, due, succeeded, now)
  local D = DEP .. k
  if redis.call('ZREM', D .. ':slots', ref) == 1 then
    local first = redis.call('ZRANGE', D .. ':waiting', 0, 0)
    if first[1] then
      redis.call('ZREM', D .. ':waiting', first[1])
      wake_for(now)
      redis.call('ZADD', DUE, 'XX', now, first[1])
    end
  end
  local h = redis.call('HMGET', D, 'breaker', 'probe', 'fails', 'fails_since', 'paused_until',
    'breaker_failures', 'breaker_window_ms', 'breaker_open_ms', 'resume')
  local breaker = h[1] or 'closed'
  local resume = h[9] == '1'
  local w = {}
  if (signal == 'pause' or signal == 'down') and due then
    resume = true
    w[#w + 1] = 'resume'; w[#w + 1] = '1'
    if due > (tonumber(h[5]) or 0) then
      w[#w + 1] = 'paused_until'; w[#w + 1] = due
      w[#w + 1] = 'pause_code'; w[#w + 1] = signal == 'pause' and 'RATE_LIMITED'
        or 'DEPENDENCY_UNAVAILABLE'
    end
  end
  local failure = signal == 'down' or signal == 'failure'
  local ok = succeeded or not signal
  local open_ms = tonumber(h[8]) or DEP_DEFAULT[7]
  local let_go = false
  local breaker_probe = breaker == 'half_open' and h[2] == ref
  if breaker_probe then
    if failure then
      w[#w + 1] = 'breaker'; w[#w + 1] = 'open'
      w[#w + 1] = 'open_until'; w[#w + 1] = now + open_ms
      w[#w + 1] = 'probe'; w[#w + 1] = ''
      redis.call('HINCRBY', D, 'n_opened', 1)
    elseif ok then
      w[#w + 1] = 'breaker'; w[#w + 1] = 'closed'
      w[#w + 1] = 'fails'; w[#w + 1] = 0
      w[#w + 1] = 'fails_since'; w[#w + 1] = 0
      w[#w + 1] = 'probe'; w[#w + 1] = ''
      w[#w + 1] = 'resume'; w[#w + 1] = '0'
      let_go = true
    end
  elseif resume and h[2] == ref then
    -- the probe after a pause: its success lets the others go; anything else leaves the
    -- key to the next probe
    w[#w + 1] = 'probe'; w[#w + 1] = ''
    if ok then
      w[#w + 1] = 'resume'; w[#w + 1] = '0'
      let_go = true
    end
  end
  if let_go then
    -- the calls the key holds back, due now, spread over up to a second (10 ms apart)
    local held = redis.call('ZRANGE', D .. ':waiting', 0, -1)
    if #held > 0 then
      wake_for(now)
      local step = math.min(10, 1000 / #held)
      for i, r in ipairs(held) do
        redis.call('ZADD', DUE, 'XX', 'LT', math.floor(now + (i - 1) * step), r)
      end
    end
  end
  if failure and not breaker_probe then  -- the breaker's probe was settled above
    local fails, since = tonumber(h[3]) or 0, tonumber(h[4]) or 0
    if now - since > (tonumber(h[7]) or DEP_DEFAULT[6]) then
      fails, since = 1, now
    else
      fails = fails + 1
    end
    w[#w + 1] = 'fails'; w[#w + 1] = fails
    w[#w + 1] = 'fails_since'; w[#w + 1] = since
    if breaker == 'closed' and fails >= (tonumber(h[6]) or DEP_DEFAULT[5]) then
      w[#w + 1] = 'breaker'; w[#w + 1] = 'open'
      w[#w + 1] = 'open_until'; w[#w + 1] = now + open_ms
      redis.call('HINCRBY', D, 'n_opened', 1)
    end
  end
  if #w > 0 then redis.call('HSET', D, unpack(w)) end
end
"""
)
