-- start.lua: begin one attempt of a job and hand its upload to the worker.
--
-- KEYS[1..5], ARGV[1..8]: the job-step header (common.lua), then
-- KEYS[6] P:upload:<uploadId from the message>   KEYS[7] P:jobs:waiting   KEYS[8] P:jobs:unsent
-- ARGV[9] uploadId  ARGV[10] maxAttempts  ARGV[11] public error JSON for exhausted attempts
-- KEYS[9] P:jobs:deadline   KEYS[10] P:fence (the fencing token counter)
-- ARGV[12] lease ms (the attempt holds the job this long unless renewed, renew.lua)
-- ARGV[13] cap ms (time limit + stall margin: no renewal goes past start + cap)
-- ARGV[14] public error JSON for a missing upload
-- ARGV[15] public error JSON import.worker_lost (a takeover of an attempt whose lease ran out)
--
-- The attempt counter lives in the record, not in the message: a message
-- redelivered after a worker died counts as a new attempt too.
--
-- Fencing: each attempt gets a token (INCR P:fence), stored in the record as
-- `token`; progress, apply and fail take effect only with the current token
-- while the job is active. A delivery that finds the job active under a live
-- lease (its deadline in the future) starts no second concurrent attempt: it
-- returns {'busy', attempt} and is dropped.
--
-- Returns {'started', attempt, batchId, owner, contentSha256, csv, token}
--       | {'missing'} | {'stale'} | {'finished', state} | {'exhausted', attempt}
--       | {'upload_missing', attempt} (recorded failed here) | {'busy', attempt}

local step = job_step(KEYS, ARGV)
local upload_id, max_attempts = ARGV[9], tonumber(ARGV[10])
local rec = redis.call('HMGET', step.key, 'state', 'uploadId', 'batchId', 'owner', 'contentSha256', 'startedAt')
local state = rec[1]
if not state then return {'missing'} end
if rec[2] ~= upload_id then return {'stale'} end
if is_finished(state) then return {'finished', state} end
if state == 'active' then
  local deadline = tonumber(redis.call('ZSCORE', KEYS[9], step.id) or '0')
  if deadline > step.now then return {'busy', redis.call('HGET', step.key, 'attempt')} end
  -- The running attempt's lease ran out (its worker died or stopped): this
  -- delivery takes over, and records the lost attempt as the reconciler
  -- would (reconcile.lua), so the history reads the same whoever got there first.
  local lost = redis.call('HGET', step.key, 'attempt')
  redis.call('HSET', step.key, 'error', ARGV[15], 'diagnostic', 'attempt ' .. lost .. ' stalled: its lease ran out')
  emit(step.events, step.maxlen, 'retrying', step.id, rec[3], lost, ARGV[15])
  count(step.stats, 'retries')
end

local attempt = redis.call('HINCRBY', step.key, 'attempt', 1)
redis.call('ZREM', KEYS[7], step.id)
redis.call('ZREM', KEYS[8], step.id)

if attempt > max_attempts then
  mark_failed(step, rec[3], rec[4], attempt, ARGV[11],
    'attempt ' .. attempt .. ' exceeds max attempts ' .. ARGV[10] .. ' (worker died or was stopped on each)')
  redis.call('ZREM', KEYS[9], step.id)
  return {'exhausted', attempt}
end

local csv = redis.call('GET', KEYS[6])
if not csv then
  mark_failed(step, rec[3], rec[4], attempt, ARGV[14], 'upload key missing')
  redis.call('ZREM', KEYS[9], step.id)
  return {'upload_missing', attempt}
end

local now = step.now
local token = tostring(redis.call('INCR', KEYS[10]))
local cap = now + tonumber(ARGV[13])
local fields = {'state', 'active', 'updatedAt', now, 'progress', '', 'attemptStartedAt', now,
  'token', token, 'leaseCap', cap}
if not rec[6] then
  fields[#fields + 1] = 'startedAt'
  fields[#fields + 1] = now
end
redis.call('HSET', step.key, unpack(fields))
redis.call('ZADD', step.active, now, step.id)
redis.call('ZADD', KEYS[9], math.min(now + tonumber(ARGV[12]), cap), step.id)
emit(step.events, step.maxlen, 'active', step.id, rec[3], attempt, '{}')
return {'started', attempt, rec[3], rec[4], rec[5], csv, token}
