-- retain_index.lua: the first script of a retention pass over one partition
-- (adapters/redis/upkeep.py): jobs that became final go into their owner's
-- retention index, then the records to remove are picked. Every key is
-- declared: the caller read P:jobs:finished:new and each job's owner just
-- before (plain reads), and this script checks what it was told.
--
-- KEYS[1] P:jobs:finished:new   KEYS[2] P:jobs:completed   KEYS[3] P:jobs:failed
-- KEYS[4] onwards: per job of ARGV[5] onwards, in order, three keys:
--   P:job:<jobId>, P:jobs:completed:<owner>, P:jobs:failed:<owner> (owner as the caller read it)
-- ARGV[1] keepCompletedAgeMs  ARGV[2] keepCompletedCount  ARGV[3] keepFailedAgeMs  ARGV[4] keepFailedCount
-- ARGV[5] onwards: jobId, owner pairs ('' for a record without an owner, or none)
--
-- A job leaves P:jobs:finished:new once indexed, or when its record is gone,
-- or when it is final no more (retried). A record whose owner is not the one
-- the caller read stays for the next pass.
--
-- Then the picks, at most 500 of each kind: finished records older than their
-- age (all owners), and all but the newest `count` of each owner seen here.
-- Returns a flat list {jobId, 'completed'|'failed', score in that all-owner index, ...}
-- (a job may come twice); retain_drop.lua removes them.

local now = server_ms()
local LIMIT = 500
local new, completed, failed = KEYS[1], KEYS[2], KEYS[3]
local owner_indexes = {}  -- owner index key -> its kind, each once

local first = 5
for i = 0, (#ARGV - first + 1) / 2 - 1 do
  local job_id, owner = ARGV[first + 2 * i], ARGV[first + 2 * i + 1]
  local job_key, completed_of, failed_of = KEYS[4 + 3 * i], KEYS[5 + 3 * i], KEYS[6 + 3 * i]
  if redis.call('ZSCORE', new, job_id) then
    local rec = redis.call('HMGET', job_key, 'state', 'owner')
    if not rec[1] then
      redis.call('ZREM', new, job_id)
    elseif (rec[2] or '') == owner then
      local score = redis.call('ZSCORE', completed, job_id)
      if score then
        redis.call('ZADD', completed_of, score, job_id)
        owner_indexes[completed_of] = 'completed'
      else
        score = redis.call('ZSCORE', failed, job_id)
        if score then
          redis.call('ZADD', failed_of, score, job_id)
          owner_indexes[failed_of] = 'failed'
        end
      end
      redis.call('ZREM', new, job_id)
    end
  end
end

local out = {}
local function pick(kind, entries)
  for j = 1, #entries, 2 do
    out[#out + 1] = entries[j]
    out[#out + 1] = kind
    out[#out + 1] = entries[j + 1]
  end
end
pick('completed', redis.call('ZRANGEBYSCORE', completed, '-inf', '(' .. (now - tonumber(ARGV[1])),
  'WITHSCORES', 'LIMIT', 0, LIMIT))
pick('failed', redis.call('ZRANGEBYSCORE', failed, '-inf', '(' .. (now - tonumber(ARGV[3])),
  'WITHSCORES', 'LIMIT', 0, LIMIT))
for key, kind in pairs(owner_indexes) do
  local keep = tonumber(kind == 'completed' and ARGV[2] or ARGV[4])
  local extra = redis.call('ZCARD', key) - keep
  if extra > 0 then
    pick(kind, redis.call('ZRANGE', key, 0, math.min(extra, LIMIT) - 1, 'WITHSCORES'))
  end
end
return out
