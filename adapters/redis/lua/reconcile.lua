-- reconcile.lua: one pass of the reconciler. Every job that is not final has
-- a deadline; a job past it has lost its message or its worker. This pass
-- sends such jobs again, or fails them once their attempts are used up.
--
-- KEYS[1] P:jobs:unsent    (jobId -> createdAt: recorded, message not confirmed sent)
-- KEYS[2] P:jobs:deadline  (jobId -> deadline ms: sent-but-not-started, active, retrying)
-- KEYS[3] P:jobs:active    KEYS[4] P:jobs:failed   KEYS[5] P:events   KEYS[6] P:stats
-- ARGV[1] waiting grace ms  ARGV[2] max jobs per pass  ARGV[3] max attempts
-- ARGV[4] events maxlen  ARGV[5] 'P:job:'  ARGV[6] 'P:upload:'  ARGV[7] 'P:jobs:owner:'
-- ARGV[8] 'P:jobs:failed:'  ARGV[9] keepFailedAgeMs  ARGV[10] keepFailedCount
-- ARGV[11] public error JSON import.attempts_exhausted
-- ARGV[12] public error JSON import.worker_lost (the record of a stalled attempt)
-- KEYS[7] P:reconciler:pass (the server time of the last pass)
-- ARGV[13] outage gap ms  ARGV[14] lease ms  ARGV[15] max stalls
-- ARGV[16] public error JSON import.stalled
--
-- Blame. An attempt counts toward IMPORTER_MAX_ATTEMPTS only for what can be
-- blamed on it (fail.lua: the application's errors, the time limit); one that
-- lost its store is an outage (`outages`, never counted). An active job past
-- its lease is a stall (`stalls`, counted apart, at most ARGV[15]: then it
-- fails with import.stalled) only when the store was answering: a pass that
-- comes more than the outage gap after the previous one (the store was away,
-- or no worker ran a pass) gives each expired lease one more lease instead,
-- and blames nobody. Counted attempts = attempt - outages - stalls.
--
-- Deadlines (the server's clock, except the unsent index and mark_sent: the producer's):
--   recorded, not confirmed sent   createdAt + grace              (P:jobs:unsent, enqueue.lua)
--   sent, not started              sentAt + grace                 (RedisStore.mark_sent)
--   active                         a lease, renewed by the running worker (renew.lua) up to
--                                  attempt start + time limit + stall margin (start.lua)
--   retrying                       nextAttemptAt + grace          (fail.lua)
-- A job sent again gets its next deadline at now + grace x 2^n (n = times sent
-- again before, at most 8 x grace), so a long backlog is not flooded with
-- duplicates. A duplicate is harmless: start.lua drops it for a finished job
-- or a job whose attempt holds a live lease, and the done marker stops a
-- second addition.
--
-- Returns a flat list {jobId, batchId, uploadId, ...} of messages to send.

local grace, limit, max_attempts = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local gap, lease, max_stalls = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local now = server_ms()
local out = {}
local last_pass = tonumber(redis.call('GET', KEYS[7]) or '0')
local after_outage = now - last_pass > gap
redis.call('SET', KEYS[7], now)

local function step_for(job_id)
  return {
    key = ARGV[5] .. job_id, events = KEYS[5], active = KEYS[3], failed = KEYS[4], stats = KEYS[6],
    id = job_id, maxlen = ARGV[4], job_prefix = ARGV[5], upload_prefix = ARGV[6],
    owner_jobs_prefix = ARGV[7], failed_of = ARGV[8],
    keep_failed_age = tonumber(ARGV[9]), keep_failed_count = tonumber(ARGV[10]), now = now,
  }
end

local function resend(job_id, rec)
  local n = tonumber(redis.call('HINCRBY', ARGV[5] .. job_id, 'resends', 1))
  redis.call('ZADD', KEYS[2], now + grace * math.min(2 ^ (n - 1), 8), job_id)
  out[#out + 1] = job_id
  out[#out + 1] = rec[2]
  out[#out + 1] = rec[3]
end

-- Recorded but never confirmed sent (the producer died, or its send failed).
for _, job_id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - grace, 'LIMIT', 0, limit)) do
  redis.call('ZREM', KEYS[1], job_id)
  local rec = redis.call('HMGET', ARGV[5] .. job_id, 'state', 'batchId', 'uploadId')
  if rec[1] == 'waiting' or rec[1] == 'retrying' then resend(job_id, rec) end
end

for _, job_id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)) do
  local step = step_for(job_id)
  local rec = redis.call('HMGET', step.key, 'state', 'batchId', 'uploadId', 'attempt', 'owner', 'outages', 'stalls')
  local attempt = tonumber(rec[4] or '0')
  local stalls = tonumber(rec[7] or '0')
  local counted = attempt - tonumber(rec[6] or '0') - stalls
  if not rec[1] or is_finished(rec[1]) then
    redis.call('ZREM', KEYS[2], job_id)
  elseif rec[1] == 'active' and after_outage then
    -- Nobody can be blamed for a lease that ran out while the store was away:
    -- one more lease, for its worker to renew (a dead one is a stall next time).
    redis.call('ZADD', KEYS[2], now + lease, job_id)
    count(KEYS[6], 'outage_extensions')
  elseif rec[1] == 'active' then
    -- The attempt's lease ran out while the store answered: a stall. Take the
    -- job back from it; its token no longer matches an active job, so nothing
    -- it writes later lands.
    stalls = tonumber(redis.call('HINCRBY', step.key, 'stalls', 1))
    count(KEYS[6], 'stalls')
    redis.call('ZREM', KEYS[3], job_id)
    if stalls > max_stalls then
      redis.call('ZREM', KEYS[2], job_id)
      mark_failed(step, rec[2], rec[5], attempt, ARGV[16], 'attempt ' .. attempt .. ' stalled: its lease ran out (stall ' ..
        stalls .. ' of at most ' .. max_stalls .. ')')
    else
      redis.call('HSET', step.key, 'state', 'retrying', 'error', ARGV[12],
        'diagnostic', 'attempt ' .. attempt .. ' stalled: its lease ran out', 'nextAttemptAt', now, 'updatedAt', now)
      emit(KEYS[5], ARGV[4], 'retrying', job_id, rec[2], attempt, ARGV[12])
      count(KEYS[6], 'retries')
      resend(job_id, rec)
    end
  elseif counted >= max_attempts and rec[1] ~= 'waiting' then
    redis.call('ZREM', KEYS[2], job_id)
    mark_failed(step, rec[2], rec[5], attempt, ARGV[11], 'attempt ' .. attempt .. ' (' .. counted .. ' counted) of ' ..
      max_attempts .. ' passed its deadline in state ' .. rec[1] .. ' (its message was lost)')
  else
    resend(job_id, rec)
  end
end
return out
