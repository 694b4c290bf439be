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
-- Each job's KEYS and ARGV are made from a template the call gives once: the
-- values its jobs share (the partition's indexes, the door's keys, the owner,
-- the settings...) are sent once, and each job sends only its own (its job,
-- upload, done marker, rate window and event stream keys; its ids, clock, CSV
-- and hash), then what it has beyond the template (its own message's keys and
-- arguments, a traceparent). Sending each shared value once per job was a
-- third of the call's arguments: the server parses and the producer packs each.
--
-- KEYS: [group] the queue's list, its message hash, P:jobs:deadline; then the
--   template's shared keys, in position order; then per job: its own keys (at
--   the key holes, in order), then its keys beyond the template.
-- ARGV[1] how many jobs  ARGV[2] [group] the message's redis_message_id ('': no group)
-- ARGV[3] ARGV[4] [group] the encoded message before and after its list of jobs
-- ARGV[5] [group] waiting grace ms
-- ARGV[6] the key holes: the positions (in enqueue.lua's KEYS) each job gives, comma-separated
-- ARGV[7] the template's number of KEYS  ARGV[8] the argument holes  ARGV[9] the template's number of ARGV
--   then the template's shared arguments, in position order;
--   then per job: the number of its keys beyond the template, of its arguments beyond
--   it, [group] its entry in the message's list ('': not in the group: a large upload,
--   sent with its own message), its own arguments (at the argument holes, in order),
--   then its arguments beyond the template.
--
-- Returns per job, in order: its enqueue.lua reply ({'created', 1} for a job of the group).

local t = redis.call('TIME')
BATCH = {now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), groups = {}, sums = {}, memo = {}}

local function holes(list)
  local out = {}
  for position in string.gmatch(list, '%d+') do out[#out + 1] = tonumber(position) end
  return out
end

-- A template of `count` values: the shared values, read from source[from] on, at
-- the positions that are not holes (nil at the holes); and where source goes on.
local function template(hole_list, count, source, from)
  local values, is_hole = {}, {}
  for _, position in ipairs(hole_list) do is_hole[position] = true end
  for position = 1, count do
    if not is_hole[position] then values[position] = source[from]; from = from + 1 end
  end
  return values, from
end

local message_id = ARGV[2]
local key_holes, arg_holes = holes(ARGV[6]), holes(ARGV[8])
local key_count, arg_count = tonumber(ARGV[7]), tonumber(ARGV[9])
local template_keys, key_at = template(key_holes, key_count, KEYS, message_id ~= '' and 4 or 1)
local template_args, at = template(arg_holes, arg_count, ARGV, 10)

local replies, members, deadlines = {}, {}, {}
for i = 1, tonumber(ARGV[1]) do
  local extra_keys, extra_args, entry = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), ARGV[at + 2]
  at = at + 3
  local keys, args = {unpack(template_keys, 1, key_count)}, {unpack(template_args, 1, arg_count)}
  for j, position in ipairs(key_holes) do keys[position] = KEYS[key_at + j - 1] end
  key_at = key_at + #key_holes
  for j, position in ipairs(arg_holes) do args[position] = ARGV[at + j - 1] end
  at = at + #arg_holes
  for j = 1, extra_keys do keys[key_count + j] = KEYS[key_at + j - 1] end
  key_at = key_at + extra_keys
  for j = 1, extra_args do args[arg_count + j] = ARGV[at + j - 1] end
  at = at + extra_args
  BATCH.grouped = message_id ~= '' and entry ~= ''
  local reply = enqueue_step(keys, args)
  if BATCH.grouped and reply[1] == 'created' then
    members[#members + 1] = entry
    -- its ARGV[6] (the caller's clock, as enqueue.lua's own message's deadline), then its jobId (ARGV[1])
    deadlines[#deadlines + 1] = tonumber(args[6]) + tonumber(ARGV[5])
    deadlines[#deadlines + 1] = args[1]
  end
  replies[i] = reply
end
BATCH.grouped = nil
if #members > 0 then
  redis.call('HSET', KEYS[2], message_id, ARGV[3] .. table.concat(members, ',') .. ARGV[4])
  redis.call('RPUSH', KEYS[1], message_id)
  redis.call('ZADD', KEYS[3], 'NX', unpack(deadlines))
end
flush_batch()
return replies
