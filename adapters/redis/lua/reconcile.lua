-- reconcile.lua: one pass of the reconciler. Every job that is not final has
-- a deadline; a job past it has lost its message or its worker. This pass
-- sends such jobs again, or fails them once their attempts are used up.
--
-- A pass over one partition is two script calls (adapters/redis/upkeep.py):
-- reconcile_due.lua reads which jobs are due (and whether the store was away
-- since the last pass), then this script acts on them, each job's own keys
-- declared. A job is acted on only if it is still due here (its entry and
-- score are read again): what happened between the two calls counts.
--
-- KEYS[1] P:jobs:unsent    (jobId -> createdAt: recorded, message not confirmed sent)
-- KEYS[2] P:jobs:deadline  (jobId -> deadline ms: sent-but-not-started, active, retrying)
-- KEYS[3] P:jobs:active    KEYS[4] P:jobs:failed   KEYS[5] P:events   KEYS[6] P:stats
-- KEYS[7] P:jobs:finished:new
-- KEYS[8] onwards: per job of ARGV[11] onwards, in order, P:job:<jobId> then P:events:<jobId>
-- ARGV[1] waiting grace ms  ARGV[2] max attempts  ARGV[3] events maxlen
-- ARGV[4] public error JSON import.attempts_exhausted
-- ARGV[5] public error JSON import.worker_lost (the record of a stalled attempt)
-- ARGV[6] lease ms  ARGV[7] max stalls  ARGV[8] public error JSON import.stalled
-- ARGV[9] '1' when the store was away since the last pass (reconcile_due.lua), else '0'
-- ARGV[10] how many of the jobs are from P:jobs:unsent (the first ones; the rest are past their deadline)
-- ARGV[11] onwards: the due jobIds reconcile_due.lua returned
--
-- Blame. An attempt counts toward IMPORTER_MAX_ATTEMPTS only for what can be
-- blamed on it (fail.lua: the application's errors, the time limit); one that
-- lost its store is an outage (`outages`, never counted). An active job past
-- its lease is a stall (`stalls`, counted apart, at most ARGV[7]: then it
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

local grace, max_attempts = tonumber(ARGV[1]), tonumber(ARGV[2])
local lease, max_stalls = tonumber(ARGV[6]), tonumber(ARGV[7])
local after_outage = ARGV[9] == '1'
local unsent_count = tonumber(ARGV[10])
local first_job = 11
local now = server_ms()
local out = {}

local function step_for(i, job_id)
  return {
    key = KEYS[8 + 2 * i], job_events = KEYS[9 + 2 * i], events = KEYS[5], active = KEYS[3], failed = KEYS[4],
    stats = KEYS[6], finished_new = KEYS[7], id = job_id, maxlen = ARGV[3], now = now,
  }
end

local function resend(step, rec)
  local n = tonumber(redis.call('HINCRBY', step.key, 'resends', 1))
  redis.call('ZADD', KEYS[2], now + grace * math.min(2 ^ (n - 1), 8), step.id)
  out[#out + 1] = step.id
  out[#out + 1] = rec[2]
  out[#out + 1] = rec[3]
end

-- Recorded but never confirmed sent (the producer died, or its send failed).
local function unsent(step)
  local since = redis.call('ZSCORE', KEYS[1], step.id)
  if not since or tonumber(since) > now - grace then return end
  redis.call('ZREM', KEYS[1], step.id)
  local rec = redis.call('HMGET', step.key, 'state', 'batchId', 'uploadId')
  if rec[1] == 'waiting' or rec[1] == 'retrying' then resend(step, rec) end
end

local function past_deadline(step)
  local job_id = step.id
  local deadline = redis.call('ZSCORE', KEYS[2], job_id)
  if not deadline or tonumber(deadline) > now then return end
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
      mark_failed(step, rec[2], attempt, ARGV[8], 'attempt ' .. attempt .. ' stalled: its lease ran out (stall ' ..
        stalls .. ' of at most ' .. max_stalls .. ')')
    else
      redis.call('HSET', step.key, 'state', 'retrying', 'error', ARGV[5],
        'diagnostic', 'attempt ' .. attempt .. ' stalled: its lease ran out', 'nextAttemptAt', now, 'updatedAt', now)
      emit(KEYS[5], step.job_events, ARGV[3], 'retrying', job_id, rec[2], attempt, ARGV[5])
      count(KEYS[6], 'retries')
      resend(step, rec)
    end
  elseif counted >= max_attempts and rec[1] ~= 'waiting' then
    redis.call('ZREM', KEYS[2], job_id)
    mark_failed(step, rec[2], attempt, ARGV[4], 'attempt ' .. attempt .. ' (' .. counted .. ' counted) of ' ..
      max_attempts .. ' passed its deadline in state ' .. rec[1] .. ' (its message was lost)')
  else
    resend(step, rec)
  end
end

for i = 0, #ARGV - first_job do
  local step = step_for(i, ARGV[first_job + i])
  if i < unsent_count then unsent(step) else past_deadline(step) end
end
return out
