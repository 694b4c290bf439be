-- start.lua: begin one attempt of a job and hand its upload to the worker.
--
-- KEYS[1..7], ARGV[1..8]: the job-step header (common.lua; its third ARGV is the gate below), then
-- KEYS[8] P:upload:<uploadId from the message>   KEYS[9] P:jobs:waiting   KEYS[10] P:jobs:unsent
-- ARGV[9] uploadId  ARGV[10] maxAttempts  ARGV[11] public error JSON for exhausted attempts
-- KEYS[11] P:jobs:deadline   KEYS[12] P:fence (the fencing token counter)
-- ARGV[12] lease ms (the attempt holds the job this long unless renewed, renew.lua)
-- ARGV[13] cap ms (time limit + stall margin: no renewal goes past start + cap)
-- ARGV[14] public error JSON for a missing upload
--
-- The attempt counter lives in the record, not in the message. Attempts
-- counted toward maxAttempts: attempt - outages - stalls (reconcile.lua, "Blame").
--
-- Fencing: each attempt gets a token (INCR P:fence), stored in the record as
-- `token`; progress, apply and fail take effect only with the current token
-- while the job is active. A delivery that finds the job active under a live
-- lease starts no second concurrent attempt, nor does one whose lease ran out
-- (the reconciler takes that job back first): it returns {'busy', attempt}
-- and is dropped.
--
-- Returns {'started', attempt, batchId, owner, contentSha256, csv, token, now}
--       | {'missing'} | {'stale'} | {'finished', state} | {'exhausted', attempt}
--       | {'upload_missing', attempt} (recorded failed here) | {'busy', attempt}
--       | {'behind'} [ledger] (nothing changed: not verified against the ledger lately)

local step = job_step(KEYS, ARGV)
-- [ledger] The gate (adapters/processes/ledger_sync.py): with a ledger, no attempt starts
-- unless this Redis was found at or ahead of the ledger lately (P:stats ledger:verifiedUntil,
-- renewed every second). A Redis restored from an older snapshot, emptied, or a replica
-- promoted after it lagged holds no such time in the future: nothing applies there
-- before the check has run, and a location found behind is not renewed until restored.
if ARGV[3] == '1' then
  local verified_until = tonumber(redis.call('HGET', step.stats, 'ledger:verifiedUntil'))
  if not verified_until or verified_until < step.now then return {'behind'} end
end
local upload_id, max_attempts = ARGV[9], tonumber(ARGV[10])
local rec = redis.call('HMGET', step.key, 'state', 'uploadId', 'batchId', 'owner', 'contentSha256', 'startedAt',
  'outages', 'stalls', 'attempt')
local state = rec[1]
if not state then return {'missing'} end
if rec[2] ~= upload_id then return {'stale'} end
if is_finished(state) then return {'finished', state} end
if state == 'active' then
  -- Another attempt holds the job. Even when its lease ran out, this delivery
  -- does not take over: the reconciler decides whom to blame (reconcile.lua:
  -- a stall, or nobody after an outage) and sends the job again.
  if not redis.call('ZSCORE', KEYS[11], step.id) then redis.call('ZADD', KEYS[11], step.now, step.id) end
  return {'busy', redis.call('HGET', step.key, 'attempt')}
end

local attempt = tonumber(rec[9] or '0') + 1  -- written with the state below (or with the failure)
zrem(KEYS[9], step.id)
zrem(KEYS[10], step.id)
local counted = attempt - tonumber(rec[7] or '0') - tonumber(rec[8] or '0')

if counted > max_attempts then
  redis.call('HSET', step.key, 'attempt', attempt)
  mark_failed(step, rec[3], attempt, ARGV[11],
    'attempt ' .. attempt .. ' (' .. counted .. ' counted) exceeds max attempts ' .. ARGV[10])
  zrem(KEYS[11], step.id)
  return {'exhausted', attempt}
end

-- Run by start_apply.lua, the worker has the upload already: it came with the
-- message (fetch.lua), and the worker validated and applies those very bytes.
local csv = ''
if not COMBINED then csv = redis.call('GET', KEYS[8]) end
if not csv then
  redis.call('HSET', step.key, 'attempt', attempt)
  mark_failed(step, rec[3], attempt, ARGV[14], 'upload key missing')
  zrem(KEYS[11], step.id)
  return {'upload_missing', attempt}
end

local now = step.now
local token = next_token(KEYS[12])
local cap = now + tonumber(ARGV[13])
local fields = {'attempt', attempt, 'attemptStartedAt', now, 'token', token, 'leaseCap', cap}
if not rec[6] then
  fields[#fields + 1] = 'startedAt'
  fields[#fields + 1] = now
end
if COMBINED then
  -- start_apply.lua: the apply follows in this very call and ends the attempt,
  -- so no other client could ever see the job active: the apply writes these
  -- fields with the record's final state (COMBINED.record), the job never
  -- enters P:jobs:active, nor its lease P:jobs:deadline (the apply removes
  -- the deadline the job had while waiting).
  COMBINED.record = fields
else
  fields[#fields + 1], fields[#fields + 2] = 'state', 'active'
  fields[#fields + 1], fields[#fields + 2] = 'updatedAt', now
  fields[#fields + 1], fields[#fields + 2] = 'progress', ''
  redis.call('HSET', step.key, unpack(fields))
  redis.call('ZADD', step.active, now, step.id)
  redis.call('ZADD', KEYS[11], math.min(now + tonumber(ARGV[12]), cap), step.id)
end
emit(step.events, step.job_events, step.maxlen, 'active', step.id, rec[3], attempt, '{}')
return {'started', attempt, rec[3], rec[4], rec[5], csv, token, now}
