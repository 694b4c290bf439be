-- enqueue.lua: record a job and its upload, once per job id.
--
-- KEYS[1] P:job:<jobId>       KEYS[2] P:upload:<uploadId>   KEYS[3] P:done:<batchId>
-- KEYS[4] P:jobs:unsent       KEYS[5] P:jobs:waiting        KEYS[6] P:events
-- KEYS[7] P:jobs:owner:<owner>   [console] the owner's index of job records
-- ARGV[1] jobId  ARGV[2] batchId  ARGV[3] owner  ARGV[4] contentSha256
-- ARGV[5] uploadId  ARGV[6] nowMs  ARGV[7] csv bytes  ARGV[8] events maxlen
--   ARGV[4] is the upload's content key (domain/shipment.py content_key), or ''
--   when the producer did not compute it (it costs a sort of the rows):
-- ARGV[12] the SHA-256 of the upload's bytes   [identity]
-- ARGV[13] ARGV[14] a live job's uploadId and that upload's content key, as
--   the producer computed them after a 'content_needed' answer ('' '' otherwise)
--
-- KEYS[8] P:workers  KEYS[9] P:workers:accepts  KEYS[10] P:workers:v<ARGV[9]>
--   [door] the live workers (presence.lua)
-- ARGV[9] the contract version of the message this producer sends
--
-- KEYS[11] P:rate:<owner>:<window>   [rate] the owner's fixed-window counter
-- ARGV[10] the rate limit to take a token of here, 0 = not here (off, or taken
--   before the body was read: RedisStore.take_rate_token, for large bodies)
-- ARGV[11] the counter's expiry ms (twice the window, as take_rate_token sets it)
--
-- KEYS[12] P:events:<jobId>   [console] the job's own event stream (always here,
--   before the optional message keys: every key the script writes is declared)
--
-- KEYS[13] P:ledger:pruned:filter  [ledger] the batchIds whose done marker was pruned here
-- ARGV[15] [ledger] '1': the producer asked the ledger about this batch after an
--   'ask_ledger' answer (and found it new, or the same content); '' otherwise
--
-- KEYS[14] P:intake:paused  [ops] at main: refused while an operator paused intake here or
--   everywhere (at another location admit.lua checked it: this partition's own key stays empty)
--
-- With the job's dramatiq message (Redis transport, the broker on this Redis):
-- KEYS[15] <namespace>:<queue>  KEYS[16] <namespace>:<queue>.msgs  KEYS[17] P:jobs:deadline
-- ARGV[16] redis_message_id  ARGV[17] the message as dramatiq's encoder wrote it
-- ARGV[18] waiting grace ms
--   written as dramatiq's RedisBroker.enqueue (its dispatch.lua) writes it:
--   HSET the data under the id in .msgs, RPUSH the id on the queue list. So
--   no job ever exists without its message, and no unsent entry is needed;
--   the job gets the deadline of a sent message (now + grace), as
--   RedisStore.mark_sent gives it, for the reconciler.
--   Without them the job goes into P:jobs:unsent until the caller marks it sent,
--   unless enqueue_many.lua runs this step for a job of its group message.
-- ARGV[19] [trace] the W3C traceparent of the producer's span, kept in the record
--   ('traceparent'; retries carry it on); absent or '' when tracing is off
--
-- Returns {'created', sent (1|0)} | {'exists', state} | {'conflict', reason}
--   | {'paused'} [ops] (before anything, the rate token included) | {'no_worker', '1,3'} | {'rate_limited'} | {'content_needed', uploadId}
--   | {'ask_ledger'} [ledger]: no job and no done marker, and the batch is in
--   the filter of pruned batchIds: it may have been applied long ago; nothing
--   was written: the producer asks the ledger (409 for other content or
--   another owner) and calls again with ARGV[15] '1'. The worker's apply asks
--   again whatever the producer found (apply.lua, "The door"): this answer is
--   for the sender, not the guard.
--   'rate_limited' [rate]: the token is taken first, whatever follows (as
--   before the body: a replay or a conflict counts too); past the limit
--   nothing else is read or written.
--   'exists': the job record is still there with the same owner and content
--   (like BullMQ's jobId: enqueueing again is a no-op).
--   'conflict': the batchId is bound to another owner or other content, in
--   a live job record or in the durable done marker. The reason stays in logs.
--   [identity] The same bytes are the same content at once. Other bytes are
--   compared by content key (the same rows in another order are the same
--   content): without ARGV[4] the answer is 'content_needed' and nothing is
--   written; with uploadId when the live job's own content key is not known
--   either (its producer recorded only its bytes' hash): the producer reads
--   that upload, and its key, given back in ARGV[13..14] for that very
--   upload, is kept in the record.
--   'no_worker' [door]: before anything is written, when live workers exist
--   and none accepts ARGV[9]; with every version they accept, ascending
--   (domain/contract.py live_workers_can_run decides the same). Live: a
--   presence entry whose expiry, on the server's clock, is not past.

local job_key, upload_key, done_key = KEYS[1], KEYS[2], KEYS[3]
local job_id, batch_id, owner, sha = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if intake_paused(KEYS[14], 'main') then return {'paused'} end  -- [ops]

local rate_limit = tonumber(ARGV[10])  -- [rate]
if rate_limit > 0 then
  local used = redis.call('INCR', KEYS[11])
  redis.call('PEXPIRE', KEYS[11], ARGV[11])
  if used > rate_limit then return {'rate_limited'} end
end

local raw = ARGV[12]
local existing = redis.call('HMGET', job_key, 'state', 'owner', 'contentSha256', 'rawSha256', 'uploadId')
if existing[1] then
  if existing[2] ~= owner then return {'conflict', 'owner'} end
  if raw ~= '' and existing[4] == raw then return {'exists', existing[1]} end  -- [identity] the same bytes
  local stored = existing[3]
  if not stored or stored == '' then
    if ARGV[13] == '' or ARGV[13] ~= existing[5] then return {'content_needed', existing[5] or ''} end
    -- That upload is gone and its content never keyed (a completed job keeps
    -- its key, apply.lua): it cannot be shown to be the same content.
    if ARGV[14] == '' then return {'conflict', 'content'} end
    stored = ARGV[14]
    redis.call('HSET', job_key, 'contentSha256', stored)
  end
  if sha == '' then return {'content_needed', ''} end
  if stored ~= sha then return {'conflict', 'content'} end
  return {'exists', existing[1]}
end

local done = redis.call('HMGET', done_key, 'owner', 'contentSha256')
if done[1] then
  if done[1] ~= owner then return {'conflict', 'owner'} end
  if sha == '' then return {'content_needed', ''} end  -- [identity] a done marker keeps the content key only
  if done[2] ~= sha then return {'conflict', 'content'} end
end

if not done[1] and ARGV[15] ~= '1' and maybe_pruned(KEYS[13], batch_id) then return {'ask_ledger'} end  -- [ledger]

local refused = no_worker_accepts(KEYS[8], KEYS[9], KEYS[10], ARGV[9])  -- [door]
if refused then return {'no_worker', refused} end

redis.call('HSET', job_key,
  'id', job_id, 'batchId', batch_id, 'owner', owner, 'state', 'waiting',
  'attempt', 0, 'contentSha256', sha, 'rawSha256', raw, 'uploadId', ARGV[5],
  'createdAt', ARGV[6], 'updatedAt', ARGV[6])
redis.call('SET', upload_key, ARGV[7])
zadd(KEYS[5], ARGV[6], job_id)
zadd(KEYS[7], ARGV[6], job_id)  -- [console] GET /api/imports
if ARGV[19] and ARGV[19] ~= '' then redis.call('HSET', job_key, 'traceparent', ARGV[19]) end  -- [trace]
emit(KEYS[6], KEYS[12], ARGV[8], 'waiting', job_id, batch_id, 0, '{}')
local queue_key, messages_key = KEYS[15], KEYS[16]
local message_id, message_data = ARGV[16], ARGV[17]
if queue_key and message_id then
  redis.call('HSET', messages_key, message_id, message_data)
  redis.call('RPUSH', queue_key, message_id)
  redis.call('ZADD', KEYS[17], 'NX', tonumber(ARGV[6]) + tonumber(ARGV[18]), job_id)
  return {'created', 1}
end
-- In a group of enqueue_many.lua, that call writes the group's one message for every job it created.
if BATCH and BATCH.grouped then return {'created', 1} end
zadd(KEYS[4], ARGV[6], job_id)
return {'created', 0}
