-- ops_overview.lua: [ops] one location's queue as the operators' view shows it,
-- read in one step (so the numbers agree with each other).
--
-- KEYS[1] P:jobs:waiting  KEYS[2] P:jobs:unsent  KEYS[3] P:jobs:active
-- KEYS[4] P:jobs:deadline  KEYS[5] P:jobs:failed  KEYS[6] P:stats
--
-- Returns {server ms, waiting, the oldest waiting job's createdAt ('' when none),
-- active, retrying, failed (records kept), stalls (ever), field, count, field, count...}
-- with the 'recent:' fields of P:stats (count_recent_failure in common.lua).
-- Retrying: the sent jobs between two attempts. Every sent job not final has a
-- deadline (waiting ones their grace, active ones their lease, retrying ones
-- their next attempt), so they are the deadlines that are neither a sent waiting
-- job nor an active one.

local waiting, unsent, active = redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3])
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ''
local retrying = math.max(0, redis.call('ZCARD', KEYS[4]) - active - math.max(0, waiting - unsent))
local out = {server_ms(), waiting, oldest, active, retrying, redis.call('ZCARD', KEYS[5]),
  redis.call('HGET', KEYS[6], 'stalls') or '0'}
local stats = redis.call('HGETALL', KEYS[6])
for i = 1, #stats, 2 do
  if string.sub(stats[i], 1, 7) == 'recent:' and stats[i] ~= 'recent:hour' then
    out[#out + 1] = stats[i]
    out[#out + 1] = stats[i + 1]
  end
end
return out
