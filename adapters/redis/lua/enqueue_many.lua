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
-- KEYS: each job's enqueue.lua KEYS, one job after the other.
-- ARGV[1] how many jobs; then per job: the number of its KEYS, the number of
--   its ARGV, then its ARGV.
--
-- Returns per job, in order: its enqueue.lua reply.

local t = redis.call('TIME')
BATCH = {now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), groups = {}, sums = {}, memo = {}}

local replies = {}
local key_at, at = 1, 2
for i = 1, tonumber(ARGV[1]) do
  local nkeys, nargs = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  replies[i] = enqueue_step({unpack(KEYS, key_at, key_at + nkeys - 1)}, {unpack(ARGV, at + 2, at + 1 + nargs)})
  key_at, at = key_at + nkeys, at + 2 + nargs
end
flush_batch()
return replies
