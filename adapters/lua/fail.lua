-- fail.lua: record a failed attempt: 'retrying' when another attempt will
-- come, 'failed' when not.
--
-- KEYS[1..5], ARGV[1..8]: the job-step header (common.lua), then
-- ARGV[9] attempt ('' = a failure before any attempt started, e.g. an
-- unreadable message: counts as a new attempt)  ARGV[10] final ('1' or '0')
-- ARGV[11] public error JSON  ARGV[12] diagnostic (operators only)
-- ARGV[13] next attempt at (ms, '' when final)
--
-- A finished job is never changed (returns {'finished', state}).
-- Returns {'failed'} | {'retrying'} | {'finished', state} | {'missing'}

local step = job_step()
local error_json, diagnostic = ARGV[11], ARGV[12]
local rec = redis.call('HMGET', step.key, 'state', 'batchId', 'owner')
if not rec[1] then return {'missing'} end
if is_finished(rec[1]) then return {'finished', rec[1]} end

local attempt = ARGV[9]
if attempt == '' then attempt = redis.call('HINCRBY', step.key, 'attempt', 1) end
if ARGV[10] == '1' then
  mark_failed(step, rec[2], rec[3], attempt, error_json, diagnostic)
  return {'failed'}
end
redis.call('ZREM', step.active, step.id)
redis.call('HSET', step.key, 'state', 'retrying', 'error', error_json, 'diagnostic', diagnostic,
  'nextAttemptAt', ARGV[13], 'updatedAt', step.now)
emit(step.events, step.maxlen, 'retrying', step.id, rec[2], attempt, error_json)
count(step.stats, 'retries')
return {'retrying'}
