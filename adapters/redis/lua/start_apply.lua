-- start_apply.lua: one script call for a small import whose upload the
-- worker received with its queue message (fetch.lua) and has already parsed
-- and validated: start the attempt (start.lua), record 'validated', apply and
-- complete (apply.lua), and acknowledge the queue message, atomically.
--
-- adapters/redis/scripts.py puts start.lua and apply.lua above this file, unchanged,
-- as the functions start_step(KEYS, ARGV) and apply_step(KEYS, ARGV): the
-- rules, checks, events and counters are theirs; this file only hands each its
-- KEYS and ARGV and passes what the start learnt (attempt, owner, fencing
-- token) to the apply. The events are the separate steps' own, in the same
-- order: active, progress 'validated', progress 'committed', completed (or failed).
--
-- KEYS: the job-step header (common.lua, 7 keys, the job's own event stream
-- P:events:<jobId> among them), start.lua's own KEYS[8..12],
-- apply.lua's own KEYS[8..] (as many as apply.lua declares), then the last
-- three: dramatiq's acks set of this worker and queue, the queue's message
-- hash, dramatiq's worker heartbeats (so that a key added to apply.lua needs
-- no change here: RedisStore.start_and_apply passes apply's list as it is)
-- ARGV[1..8]   the job-step header
-- ARGV[9..14]  start.lua's ARGV[9..14]
-- ARGV[15] the dramatiq message's redis_message_id ('' = do not acknowledge)
-- ARGV[16] the dramatiq worker id   ARGV[17] the worker's clock in ms (its heartbeat, as dramatiq's ack)
-- ARGV[18..]   apply.lua's ARGV[9..] (the apply's owner, attempt and token are set here from the start)
--
-- Acknowledging: exactly what dramatiq's own ack does (dispatch.lua 'ack':
-- heartbeat, SREM from the acks set, HDEL of the message when it was there),
-- for every outcome after which the actor returns normally. Not for a
-- permanent failure (conflict, overflow, upload missing): dramatiq rejects
-- that message itself (its nack), as with the separate steps.
--
-- Returns {start reply (its csv replaced by ''), apply reply or {}, 1 if acknowledged else 0}

-- Each step's KEYS and ARGV. unpack() runs in C (a loop in Lua here cost a
-- tenth of the whole call) but has a stack limit of a few thousand values:
-- the rows of a large upload (IMPORTER_ONE_STEP_MAX_BYTES raised) take the loop.
local function slice(list, from, to, into)
  local out = into or {}
  for i = from, to do out[#out + 1] = list[i] end
  return out
end

local acks_key, messages_key, heartbeats_key = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local start_keys = {unpack(KEYS, 1, 12)}  -- the job-step header (7) and start.lua's own (5)
local start_argv = {unpack(ARGV, 1, 14)}
local apply_keys = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], unpack(KEYS, 13, #KEYS - 3)}
local apply_argv
if #ARGV < 4000 then
  apply_argv = {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], unpack(ARGV, 18)}
else
  apply_argv = slice(ARGV, 18, #ARGV, {unpack(ARGV, 1, 8)})
end

local function acknowledge()
  if ARGV[15] == '' then return 0 end
  redis.call('ZADD', heartbeats_key, ARGV[17], ARGV[16])
  if redis.call('SREM', acks_key, ARGV[15]) > 0 then
    redis.call('HDEL', messages_key, ARGV[15])
  end
  return 1
end

local combined = {}  -- what the start hands the apply (start.lua: the record's fields of the attempt)
local started = start_step(start_keys, start_argv, combined)
if started[1] ~= 'started' then
  local acked = 0
  if started[1] ~= 'upload_missing' then acked = acknowledge() end
  return {started, {}, acked}
end
-- {'started', attempt, batchId, owner, contentSha256, csv, token, now}
started[6] = ''
apply_argv[11] = started[4] or ''
apply_argv[12] = started[2]
apply_argv[19] = started[7]
-- The apply reads neither the clock nor the record again (the start just made
-- them) and writes the start's fields of the record with its own.
local applied = apply_step(apply_keys, apply_argv, {now = started[8], token = started[7], record = combined.record})
local acked = 0
if applied[1] ~= 'conflict' and applied[1] ~= 'overflow' then acked = acknowledge() end
return {started, applied, acked}
