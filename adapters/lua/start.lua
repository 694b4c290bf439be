-- start.lua: begin one attempt of a job and hand its upload to the worker.
--
-- KEYS[1..5], ARGV[1..8]: the job-step header (common.lua), then
-- KEYS[6] P:upload:<uploadId from the message>   KEYS[7] P:jobs:waiting   KEYS[8] P:jobs:unsent
-- ARGV[9] uploadId  ARGV[10] maxAttempts  ARGV[11] public error JSON for exhausted attempts
--
-- The attempt counter lives in the record, not in the message: a message
-- redelivered after a worker died counts as a new attempt too.
--
-- Returns {'started', attempt, batchId, owner, contentSha256, csv}
--       | {'missing'} | {'stale'} | {'finished', state} | {'exhausted', attempt}
--       | {'upload_missing', attempt}

local step = job_step()
local upload_id, max_attempts = ARGV[9], tonumber(ARGV[10])
local rec = redis.call('HMGET', step.key, 'state', 'uploadId', 'batchId', 'owner', 'contentSha256')
local state = rec[1]
if not state then return {'missing'} end
if rec[2] ~= upload_id then return {'stale'} end
if is_finished(state) then return {'finished', state} end

local attempt = redis.call('HINCRBY', step.key, 'attempt', 1)
redis.call('ZREM', KEYS[7], step.id)
redis.call('ZREM', KEYS[8], step.id)

if attempt > max_attempts then
  mark_failed(step, rec[3], rec[4], attempt, ARGV[11],
    'attempt ' .. attempt .. ' exceeds max attempts ' .. ARGV[10] .. ' (worker died or was stopped on each)')
  return {'exhausted', attempt}
end

local csv = redis.call('GET', KEYS[6])
if not csv then
  return {'upload_missing', attempt}
end

local now = step.now
local fields = {'state', 'active', 'updatedAt', now, 'progress', '', 'attemptStartedAt', now}
if redis.call('HEXISTS', step.key, 'startedAt') == 0 then
  fields[#fields + 1] = 'startedAt'
  fields[#fields + 1] = now
end
redis.call('HSET', step.key, unpack(fields))
redis.call('ZADD', step.active, now, step.id)
emit(step.events, step.maxlen, 'active', step.id, rec[3], attempt, '{}')
return {'started', attempt, rec[3], rec[4], rec[5], csv}
