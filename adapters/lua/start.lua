-- start.lua: begin one attempt of a job and hand its upload to the worker.
--
-- KEYS[1] P:job:<jobId>      KEYS[2] P:upload:<uploadId from the message>
-- KEYS[3] P:jobs:waiting     KEYS[4] P:jobs:unsent   KEYS[5] P:jobs:active
-- KEYS[6] P:jobs:failed      KEYS[7] P:events
-- ARGV[1] jobId  ARGV[2] uploadId  ARGV[3] nowMs  ARGV[4] maxAttempts
-- ARGV[5] events maxlen  ARGV[6] prefix  ARGV[7] keepFailedAgeMs
-- ARGV[8] keepFailedCount  ARGV[9] public error JSON for exhausted attempts
--
-- The attempt counter lives in the record, not in the message: a message
-- redelivered after a worker died counts as a new attempt too.
--
-- Returns {'started', attempt, batchId, owner, contentSha256, csv}
--       | {'missing'} | {'stale'} | {'finished', state} | {'exhausted', attempt}
--       | {'upload_missing', attempt}

local job_key = KEYS[1]
local job_id = ARGV[1]
local now = server_ms()  -- attempt timestamps on the server's clock (ARGV[3] unused)
local rec = redis.call('HMGET', job_key, 'state', 'uploadId', 'batchId', 'owner', 'contentSha256')
local state = rec[1]
if not state then return {'missing'} end
if rec[2] ~= ARGV[2] then return {'stale'} end
if is_finished(state) then return {'finished', state} end

local attempt = redis.call('HINCRBY', job_key, 'attempt', 1)
redis.call('ZREM', KEYS[3], job_id)
redis.call('ZREM', KEYS[4], job_id)

local function fail_now(code_json, diagnostic)
  redis.call('HSET', job_key, 'state', 'failed', 'error', code_json, 'diagnostic', diagnostic,
    'finishedAt', now, 'updatedAt', now)
  redis.call('ZREM', KEYS[5], job_id)
  redis.call('ZADD', KEYS[6], now, job_id)
  emit(KEYS[7], ARGV[5], 'failed', job_id, rec[3], attempt, code_json)
  retain(KEYS[6], ARGV[6], now, tonumber(ARGV[7]), tonumber(ARGV[8]))
  count_failed(ARGV[6], code_json)
end

if attempt > tonumber(ARGV[4]) then
  fail_now(ARGV[9], 'attempt ' .. attempt .. ' exceeds max attempts ' .. ARGV[4] .. ' (worker died or was stopped on each)')
  return {'exhausted', attempt}
end

local csv = redis.call('GET', KEYS[2])
if not csv then
  return {'upload_missing', attempt}
end

local fields = {'state', 'active', 'updatedAt', now, 'progress', '', 'attemptStartedAt', now}
if redis.call('HEXISTS', job_key, 'startedAt') == 0 then
  fields[#fields + 1] = 'startedAt'
  fields[#fields + 1] = now
end
redis.call('HSET', job_key, unpack(fields))
redis.call('ZADD', KEYS[5], now, job_id)
emit(KEYS[7], ARGV[5], 'active', job_id, rec[3], attempt, '{}')
return {'started', attempt, rec[3], rec[4], rec[5], csv}
