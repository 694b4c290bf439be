-- retry.lua: its owner retries a failed job: a new attempt chain under the same job id.
--
-- KEYS[1] P:job:<jobId>            KEYS[2] P:upload:<the new uploadId>
-- KEYS[3] P:jobs:failed            KEYS[4] P:jobs:failed:<owner>
-- KEYS[5] P:jobs:waiting           KEYS[6] P:jobs:unsent
-- KEYS[7] P:events                 KEYS[8] P:jobs:deadline
-- ARGV[1] jobId  ARGV[2] owner (the caller)  ARGV[3] batchId (of the jobId)
-- ARGV[4] the new uploadId  ARGV[5] the record's uploadId as the caller read it just before
--   (its upload is KEYS[13]; another one now: {'changed'}, nothing written, the caller reads again)
-- ARGV[6] events maxlen
-- ARGV[7] the failure codes a retry can change, comma separated
--   (domain/retry_import.py RETRYABLE_CODES, which also words each refusal)
-- ARGV[8] nowMs (the producer's clock, as enqueue.lua)  ARGV[9] waiting grace ms
-- KEYS[9] P:workers  KEYS[10] P:workers:accepts  KEYS[11] P:workers:v<ARGV[10]>
--   [door] the live workers (presence.lua), as enqueue.lua checks them
-- ARGV[10] the contract version of the message this producer sends
--
-- KEYS[12] P:events:<jobId>   [console] the job's own event stream
-- KEYS[13] P:upload:<ARGV[5]>   the upload the record names (renamed to KEYS[2])
--
-- With the job's dramatiq message (Redis transport, the broker on this Redis):
-- KEYS[14] <namespace>:<queue>  KEYS[15] <namespace>:<queue>.msgs
-- ARGV[11] redis_message_id  ARGV[12] the message as dramatiq's encoder wrote it
--   (for the new uploadId), written as enqueue.lua writes it; the job gets the
--   deadline of a sent message. Without them the job goes into P:jobs:unsent
--   until the caller marks it sent (RedisStore.mark_sent), and the reconciler
--   sends it if the caller never does.
--
-- In this order, nothing written before the last check passed:
--   1. the owner: a missing record and another owner's take the same path
--      (one HGET) and return the same {'missing'};
--   2. the state must be 'failed'                  else {'not_retryable', 'state', state, ''};
--   3. its error's code must be in ARGV[7]         else {'not_retryable', 'code', state, code};
--   4. its upload must still exist                 else {'not_retryable', 'upload_gone', state, code};
--   5. [door] a live worker accepts ARGV[10], or none is live  else {'no_worker', '1,3'}
--      (a retry of a contract.unsupported_version failure before the workers were upgraded).
-- Then the new chain: the upload moves to the new uploadId (RENAME: the same
-- bytes; a message of the earlier chain, which names the old uploadId, is
-- then 'stale' to start.lua), the record is 'waiting' with its attempt
-- counters reset (attempt 0; resends, outages and stalls gone) and the
-- earlier chain's error, progress, result, times and fencing token cleared,
-- 'retries' counted; it leaves the failed indexes (retention no longer
-- counts it) and enters the waiting index, with the deadline or unsent entry
-- of a new job; the event 'waiting' with {"retry": n}. The done marker is not
-- touched: if the batch was applied after all, the new attempt replays it.
-- A second retry of the same job finds it 'waiting': refused (one new chain).
--
-- Returns {'retried', sent (1|0), retries} | {'missing'} | {'not_retryable', reason, state, code}
--       | {'no_worker', versions} | {'changed'} (the record names another upload than ARGV[5])

local job_key, new_upload_key = KEYS[1], KEYS[2]
local job_id, owner, batch_id, upload_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = tonumber(ARGV[8])

if redis.call('HGET', job_key, 'owner') ~= owner then return {'missing'} end
local rec = redis.call('HMGET', job_key, 'state', 'batchId', 'error', 'uploadId')
if rec[2] ~= batch_id then return {'missing'} end  -- not a job of this jobId (written by hand)
local state = rec[1]
if state ~= 'failed' then return {'not_retryable', 'state', state, ''} end

local code = ''
local ok, decoded = pcall(cjson.decode, rec[3] or '')
if ok and type(decoded) == 'table' and type(decoded['code']) == 'string' then code = decoded['code'] end
local retryable = false
for listed in string.gmatch(ARGV[7], '[^,]+') do
  if listed == code then retryable = true break end
end
if not retryable then return {'not_retryable', 'code', state, code} end

if (rec[4] or '') ~= ARGV[5] then return {'changed'} end
local old_upload_key = KEYS[13]
if not rec[4] or rec[4] == '' or redis.call('EXISTS', old_upload_key) == 0 then
  return {'not_retryable', 'upload_gone', state, code}
end
local refused = no_worker_accepts(KEYS[9], KEYS[10], KEYS[11], ARGV[10])  -- [door]
if refused then return {'no_worker', refused} end

if old_upload_key ~= new_upload_key then redis.call('RENAME', old_upload_key, new_upload_key) end
local retries = redis.call('HINCRBY', job_key, 'retries', 1)
redis.call('HDEL', job_key, 'error', 'diagnostic', 'progress', 'result', 'startedAt', 'finishedAt',
  'nextAttemptAt', 'attemptStartedAt', 'token', 'leaseCap', 'resends', 'outages', 'stalls')
redis.call('HSET', job_key, 'state', 'waiting', 'attempt', 0, 'uploadId', upload_id, 'updatedAt', now)
redis.call('ZREM', KEYS[3], job_id)
redis.call('ZREM', KEYS[4], job_id)
redis.call('ZADD', KEYS[5], now, job_id)
emit(KEYS[7], KEYS[12], ARGV[6], 'waiting', job_id, batch_id, 0, '{"retry":' .. retries .. '}')

local queue_key, messages_key = KEYS[14], KEYS[15]
local message_id, message_data = ARGV[11], ARGV[12]
if queue_key and message_id then
  redis.call('HSET', messages_key, message_id, message_data)
  redis.call('RPUSH', queue_key, message_id)
  redis.call('ZADD', KEYS[8], now + tonumber(ARGV[9]), job_id)
  return {'retried', 1, retries}
end
redis.call('ZREM', KEYS[8], job_id)
redis.call('ZADD', KEYS[6], now, job_id)
return {'retried', 0, retries}
