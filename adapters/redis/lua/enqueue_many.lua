-- enqueue_many.lua: enqueue.lua for several jobs of one partition, in order,
-- in one script call (the bulk intake: JobRecorder.enqueue_many).
--
-- adapters/redis/scripts.py puts enqueue.lua above this file, unchanged, as the
-- function enqueue_step(KEYS, ARGV): its rules, checks and events are its own;
-- this file hands each job its KEYS and ARGV, exactly those one enqueue.lua call
-- of that job would get, and returns each reply. Each job's step is made as if
-- its call came right after the one before (the script is atomic), so every
-- reply is the one the calls one after the other would have had. What the
-- call shares (common.lua, "Batched writes"): one clock, the writes to the
-- indexes (ZADD to P:jobs:waiting, the owner's index, P:jobs:unsent) made once
-- per key at the end, and the intake and door checks read once, as is whether
-- any done marker was ever pruned here (nothing the call writes changes them:
-- without the filter of pruned batchIds, no job's step reads it).
--
-- The group message [Redis transport]: the small new jobs of the call travel
-- in ONE dramatiq message (contract version 3), written here as dramatiq's
-- RedisBroker.enqueue writes a message (HSET under its id in the queue's
-- message hash, RPUSH of the id), with every job it carries, each with the
-- deadline of a sent message (as enqueue.lua's own message gives it). Only
-- the jobs the call created are in it: a job that exists, conflicts or is
-- refused is not. The caller asks for a group only while every live worker
-- reads version 3 (JobRecorder.enqueue_many).
--
-- KEYS: [group] the queue's list, its message hash, P:jobs:deadline; then each
--   job's enqueue.lua KEYS, one job after the other.
-- ARGV[1] how many jobs  ARGV[2] [group] the message's redis_message_id ('': no group)
-- ARGV[3] ARGV[4] [group] the encoded message before and after its list of jobs
-- ARGV[5] [group] waiting grace ms
--   then per job: the number of its KEYS, the number of its ARGV, [group] its
--   entry in the message's list ('': not in the group: a large upload, sent
--   with its own message), then its ARGV.
--
-- Returns per job, in order: its enqueue.lua reply ({'created', 1} for a job of the group).

local t = redis.call('TIME')
BATCH = {now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), groups = {}, sums = {}, memo = {}}

local message_id = ARGV[2]
local replies, members, deadlines = {}, {}, {}
local key_at, at = (message_id ~= '' and 4 or 1), 6
for i = 1, tonumber(ARGV[1]) do
  local nkeys, nargs, entry = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), ARGV[at + 2]
  BATCH.grouped = message_id ~= '' and entry ~= ''
  local reply = enqueue_step({unpack(KEYS, key_at, key_at + nkeys - 1)}, {unpack(ARGV, at + 3, at + 2 + nargs)})
  if BATCH.grouped and reply[1] == 'created' then
    members[#members + 1] = entry
    -- its ARGV[6] (the caller's clock, as enqueue.lua's own message's deadline), then its jobId (ARGV[1])
    deadlines[#deadlines + 1] = tonumber(ARGV[at + 8]) + tonumber(ARGV[5])
    deadlines[#deadlines + 1] = ARGV[at + 3]
  end
  replies[i] = reply
  key_at, at = key_at + nkeys, at + 3 + nargs
end
BATCH.grouped = nil
if #members > 0 then
  redis.call('HSET', KEYS[2], message_id, ARGV[3] .. table.concat(members, ',') .. ARGV[4])
  redis.call('RPUSH', KEYS[1], message_id)
  redis.call('ZADD', KEYS[3], 'NX', unpack(deadlines))
end
flush_batch()
return replies
