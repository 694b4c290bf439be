-- start_apply.lua: one script call for one or several small imports of one
-- partition whose uploads the worker received with their queue messages
-- (fetch.lua) and has already parsed and validated. For each import, in
-- order: start the attempt (start.lua), record 'validated', apply and
-- complete (apply.lua), and acknowledge its queue message. Atomically, for
-- all of them together; each import has its own outcome (a conflict or an
-- overflow fails only its own job).
--
-- adapters/redis/scripts.py puts start.lua and apply.lua above this file, unchanged,
-- as the functions start_step(KEYS, ARGV) and apply_step(KEYS, ARGV): the
-- rules, checks, events and counters are theirs; this file only hands each its
-- KEYS and ARGV and passes what the start learnt (attempt, owner, fencing
-- token) to the apply. The events are the separate steps' own, in the same
-- order: active, progress 'validated', progress 'committed', completed (or failed).
-- With several imports, the writes they share a key for are made once per key
-- at the end of the call (common.lua, "Batched writes").
--
-- KEYS: the partition's shared keys, then 5 per import.
--   KEYS[1] P:events   KEYS[2] P:jobs:active   KEYS[3] P:jobs:failed   KEYS[4] P:stats
--   KEYS[5] P:jobs:finished:new   KEYS[6] P:jobs:waiting   KEYS[7] P:jobs:unsent
--   KEYS[8] P:jobs:deadline   KEYS[9] P:fence   KEYS[10] P:stock   KEYS[11] P:generation
--   KEYS[12] P:journal   KEYS[13] P:jobs:completed
--   KEYS[14] dramatiq's acks set of this worker and queue   KEYS[15] the queue's message hash
--   KEYS[16] dramatiq's worker heartbeats   KEYS[17] P:ledger:pruned  [ledger] done markers ever pruned here
--   KEYS[18] P:ledger:pruned:filter  [ledger] the batchIds whose marker was pruned (common.lua)
--   per import: P:job:<jobId>  P:events:<jobId>  P:upload:<uploadId>  P:done:<batchId>  P:receipt:<batchId>
-- ARGV: shared, then one run of values per import.
--   ARGV[1] events maxlen   ARGV[2] maxAttempts   ARGV[3] public error JSON for exhausted attempts
--   ARGV[4] lease ms   ARGV[5] cap ms   ARGV[6] public error JSON for a missing upload
--   ARGV[7] maxStock   ARGV[8] ... for a conflict   ARGV[9] ... for an overflow
--   ARGV[10] the dramatiq worker id   ARGV[11] the worker's clock in ms (its heartbeat, as dramatiq's ack)
--   ARGV[12] '1': [ledger] start.lua's gate   ARGV[13] how many imports
--   per import: jobId, uploadId, batchId, contentSha256, the dramatiq message's
--   redis_message_id ('' = do not acknowledge), [ledger] the ledger's word on
--   the batch (apply.lua's ARGV[14..16]: '' '' '' when not asked), the number
--   of rows n, then n sku, quantity pairs
--
-- [ledger] An import whose batch has no done marker here and is in the filter
-- of pruned batchIds, when markers were pruned since the ledger was asked
-- (apply.lua, "The door"), is not started:
-- its reply is {{'ask_ledger', pruned}, {}, 0}, nothing of it changed, its
-- message not acknowledged; the worker asks the ledger and calls again.
--
-- Acknowledging: exactly what dramatiq's own ack does (dispatch.lua 'ack':
-- heartbeat, SREM from the acks set, HDEL of the message when it was there),
-- for every outcome after which the actor returns normally. Not for a
-- permanent failure (conflict, overflow, upload missing): dramatiq rejects
-- that message itself (its nack), as with the separate steps.
--
-- Returns per import, in order: {start reply (its csv ''), apply reply or {}, 1 if acknowledged else 0}

local SHARED_KEYS, PER_IMPORT_KEYS, SHARED_ARGV = 18, 5, 13
local acks_key, messages_key, heartbeats_key = KEYS[14], KEYS[15], KEYS[16]
local count = tonumber(ARGV[13])

-- Every import of the call reads one clock; the fencing tokens of the whole call are taken at once.
local t = redis.call('TIME')
BATCH = {now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), groups = {}, sums = {}}
BATCH.token = redis.call('INCRBY', KEYS[9], count) - count
local acked_ids = {}
local pruned = redis.call('GET', KEYS[17])  -- [ledger] false: no marker was ever pruned here

local replies = {}
local at = SHARED_ARGV + 1
for i = 1, count do
  local k = SHARED_KEYS + (i - 1) * PER_IMPORT_KEYS
  local job_key, job_events, upload_key, done_key, receipt_key = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]
  local job_id, upload_id, batch_id, sha, message_id = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  local ledger = {ARGV[at + 5], ARGV[at + 6], ARGV[at + 7]}
  local rows = tonumber(ARGV[at + 8])
  local first_pair = at + 9
  at = first_pair + 2 * rows

  -- (the filter first: a new batch, the common case, is not in it, and needs no EXISTS)
  if pruned and pruned ~= ledger[1] and maybe_pruned(KEYS[18], batch_id) and redis.call('EXISTS', done_key) == 0 then
    replies[i] = {{'ask_ledger', pruned}, {}, 0}
  else
  -- what the start hands the apply (start.lua: the record's fields of the attempt; [ledger]
  -- its word). The batch passed the door above: apply.lua does not ask it again.
  local combined = {ledger = ledger}
  local started = start_step(
    {job_key, KEYS[1], KEYS[2], KEYS[3], KEYS[4], job_events, KEYS[5], upload_key, KEYS[6], KEYS[7], KEYS[8], KEYS[9]},
    {job_id, ARGV[1], ARGV[12], '', '', '', '', '', upload_id, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]},
    combined)
  local applied, acked = {}, 1
  if started[1] ~= 'started' then
    if started[1] == 'upload_missing' or started[1] == 'behind' then acked = 0 end
  else
    -- {'started', attempt, batchId, owner, contentSha256, csv (''), token, now}
    local apply_keys = {job_key, KEYS[1], KEYS[2], KEYS[3], KEYS[4], job_events, KEYS[5],
      KEYS[10], KEYS[11], done_key, KEYS[12], KEYS[13], upload_key, KEYS[8], receipt_key, KEYS[17], KEYS[18]}
    local validated = '{"phase":"validated","rows":' .. rows .. '}'
    -- apply.lua's ARGV, its rows after ARGV[20]. unpack() runs in C (a loop in
    -- Lua here cost a tenth of the whole call) but has a stack limit of a few
    -- thousand values: the rows of a large upload (IMPORTER_ONE_STEP_MAX_BYTES raised) take the loop.
    local apply_argv
    if rows < 2000 then
      apply_argv = {job_id, ARGV[1], '', '', '', '', '', '', batch_id, sha, started[4] or '', started[2], ARGV[7],
        '', '', '', ARGV[8], ARGV[9], started[7], validated, unpack(ARGV, first_pair, at - 1)}
    else
      apply_argv = {job_id, ARGV[1], '', '', '', '', '', '', batch_id, sha, started[4] or '', started[2], ARGV[7],
        '', '', '', ARGV[8], ARGV[9], started[7], validated}
      for j = first_pair, at - 1 do apply_argv[#apply_argv + 1] = ARGV[j] end
    end
    -- The apply reads neither the clock nor the record again (the start just made
    -- them) and writes the start's fields of the record with its own.
    combined.now, combined.token = started[8], started[7]
    applied = apply_step(apply_keys, apply_argv, combined)
    if applied[1] == 'conflict' or applied[1] == 'overflow' then acked = 0 end
  end
  if message_id == '' then acked = 0 end
  if acked == 1 then acked_ids[#acked_ids + 1] = message_id end
  replies[i] = {started, applied, acked}
  end
end

flush_batch()
if #acked_ids > 0 then
  redis.call('ZADD', heartbeats_key, ARGV[11], ARGV[10])
  local held, present = redis.call('SMISMEMBER', acks_key, unpack(acked_ids)), {}
  for j, id in ipairs(acked_ids) do
    if held[j] == 1 then present[#present + 1] = id end
  end
  if #present > 0 then
    redis.call('SREM', acks_key, unpack(present))
    redis.call('HDEL', messages_key, unpack(present))
  end
end
return replies
