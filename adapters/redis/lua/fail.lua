-- fail.lua: record a failed attempt: 'retrying' when another attempt will
-- come, 'failed' when not.
--
-- KEYS[1..7], ARGV[1..8]: the job-step header (common.lua), then
-- ARGV[9] attempt ('' = a failure before any attempt started, e.g. an
-- unreadable message: counts as a new attempt)  ARGV[10] final: '1', '0', or
-- 'auto' (final when the attempts counted reach ARGV[18])
-- ARGV[11] public error JSON  ARGV[12] diagnostic (operators only)
-- ARGV[13] next attempt at (ms, '' when final)
-- KEYS[8] P:jobs:deadline
-- ARGV[14] the attempt's fencing token ('' = no attempt started: only allowed
--          while the job is not active)
-- ARGV[15] grace ms: a retrying job whose next attempt has not started by
--          nextAttemptAt + grace is sent again by the reconciler
-- KEYS[9] P:job:<jobId>:rejections
-- ARGV[16] the rejection report JSON ('' = none): a final failure writes it to
--          KEYS[9] (removes it when ''), in the same step as the record (retention
--          removes it with the record)
-- ARGV[17] '1' when the attempt failed because the store was away (an
--          outage: counted in `outages`, never toward the attempts, never final)
-- ARGV[18] max attempts (for 'auto'): counted = attempt - outages - stalls
-- KEYS[10] P:jobs:waiting  KEYS[11] P:jobs:unsent: a job that fails before any attempt
--   started (an unreadable message, a contract version no worker takes) leaves them here
--
-- A finished job is never changed (returns {'finished', state}); neither is
-- a job another attempt holds (returns {'stale', state}).
-- Returns {'failed'} | {'retrying'} | {'finished', state} | {'missing'} | {'stale', state}

local step = job_step()
local error_json, diagnostic = ARGV[11], ARGV[12]
local rec = redis.call('HMGET', step.key, 'state', 'batchId', 'owner')
if not rec[1] then return {'missing'} end
if is_finished(rec[1]) then return {'finished', rec[1]} end
local token = redis.call('HGET', step.key, 'token') or ''
if ARGV[14] == '' then
  if rec[1] == 'active' then return {'stale', rec[1]} end
elseif rec[1] ~= 'active' or token ~= ARGV[14] then
  return {'stale', rec[1]}
end

local attempt = ARGV[9]
if attempt == '' then
  attempt = redis.call('HINCRBY', step.key, 'attempt', 1)
  redis.call('ZREM', KEYS[10], step.id)
  redis.call('ZREM', KEYS[11], step.id)
end
local final = ARGV[10] == '1'
if ARGV[17] == '1' then
  redis.call('HINCRBY', step.key, 'outages', 1)
  count(step.stats, 'outages')
  final = false
elseif ARGV[10] == 'auto' then
  local uncounted = redis.call('HMGET', step.key, 'outages', 'stalls')
  local counted = tonumber(attempt) - tonumber(uncounted[1] or '0') - tonumber(uncounted[2] or '0')
  final = counted >= tonumber(ARGV[18])
end
if final then
  if ARGV[16] ~= '' then redis.call('SET', KEYS[9], ARGV[16]) else redis.call('DEL', KEYS[9]) end
  mark_failed(step, rec[2], attempt, error_json, diagnostic)
  redis.call('ZREM', KEYS[8], step.id)
  return {'failed'}
end
redis.call('ZREM', step.active, step.id)
redis.call('HSET', step.key, 'state', 'retrying', 'error', error_json, 'diagnostic', diagnostic,
  'nextAttemptAt', ARGV[13], 'updatedAt', step.now)
redis.call('ZADD', KEYS[8], tonumber(ARGV[13]) + tonumber(ARGV[15]), step.id)
emit(step.events, step.job_events, step.maxlen, 'retrying', step.id, rec[2], attempt, error_json)
count(step.stats, 'retries')
return {'retrying'}
