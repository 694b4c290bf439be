-- fail.lua: record a failed attempt: 'retrying' when another attempt will
-- come, 'failed' when not.
--
-- KEYS[1] P:job:<jobId>   KEYS[2] P:events   KEYS[3] P:jobs:active   KEYS[4] P:jobs:failed
-- ARGV[1] jobId  ARGV[2] nowMs  ARGV[3] attempt ('' = a failure before any
-- attempt started, e.g. an unreadable message: counts as a new attempt)  ARGV[4] final ('1' or '0')
-- ARGV[5] public error JSON  ARGV[6] diagnostic (operators only)
-- ARGV[7] next attempt at (ms, '' when final)  ARGV[8] events maxlen
-- ARGV[9] prefix  ARGV[10] keepFailedAgeMs  ARGV[11] keepFailedCount
--
-- A finished job is never changed (returns {'finished', state}).

local job_key = KEYS[1]
local job_id = ARGV[1]
local now = server_ms()  -- the server's clock, as in start.lua and apply.lua (ARGV[2] unused)
local rec = redis.call('HMGET', job_key, 'state', 'batchId')
if not rec[1] then return {'missing'} end
if is_finished(rec[1]) then return {'finished', rec[1]} end

local attempt = ARGV[3]
if attempt == '' then attempt = redis.call('HINCRBY', job_key, 'attempt', 1) end
redis.call('ZREM', KEYS[3], job_id)
if ARGV[4] == '1' then
  redis.call('HSET', job_key, 'state', 'failed', 'error', ARGV[5], 'diagnostic', ARGV[6],
    'finishedAt', now, 'updatedAt', now)
  redis.call('ZADD', KEYS[4], now, job_id)
  emit(KEYS[2], ARGV[8], 'failed', job_id, rec[2], attempt, ARGV[5])
  retain(KEYS[4], ARGV[9], now, tonumber(ARGV[10]), tonumber(ARGV[11]))
  count_failed(ARGV[9], ARGV[5])
  local started = redis.call('HGET', job_key, 'attemptStartedAt')
  if started then observe_duration(ARGV[9], now - tonumber(started)) end
  return {'failed'}
end
redis.call('HSET', job_key, 'state', 'retrying', 'error', ARGV[5], 'diagnostic', ARGV[6],
  'nextAttemptAt', ARGV[7], 'updatedAt', now)
emit(KEYS[2], ARGV[8], 'retrying', job_id, rec[2], attempt, ARGV[5])
count(ARGV[9], 'retries')
return {'retrying'}
