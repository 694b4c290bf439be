-- presence.lua: [door] a worker process says it is alive and which contract
-- versions it accepts (adapters/dramatiq/presence.py, every few seconds), or
-- that it leaves. enqueue.lua reads it to refuse work no live worker can run.
--
-- KEYS[1] P:workers           zset  worker id -> expiry ms
-- KEYS[2] P:workers:accepts   hash  worker id -> accepted versions, e.g. "1,2"
-- KEYS[3] P:workers:info      hash  worker id -> JSON the operators' view shows (ARGV[5]:
--   release, host, pid, startedAt, inFlight), kept and removed with the entry
-- KEYS[4] onwards: P:workers:v<version> of each version in ARGV[4]: that
-- version's zset, worker id -> expiry, so that enqueue.lua's check costs one
-- ZCOUNT whatever the number of workers
-- ARGV[1] worker id  ARGV[2] accepted versions ('' = the worker leaves)
-- ARGV[3] liveness window ms  ARGV[4] the versions of KEYS[3] onwards, e.g. "1,2"
--   (every version the caller knows, and all of ARGV[2]): a version's zset
--   not among them (a newer worker's) is left as it is here; its stale
--   entries never count as live (their expiry is past)
-- ARGV[5] the worker's info JSON ('' when it leaves)
--
-- The expiry is the server's clock + the window: liveness never compares
-- clocks of different hosts (worker, HTTP, Redis). Expired entries of any
-- worker (a SIGKILLed one) are pruned here, at most 100 per call.
--
-- Returns the number of live workers after this call.

local workers, accepts, info = KEYS[1], KEYS[2], KEYS[3]
local id, versions, window = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = server_ms()
local by_version, n = {}, 0  -- version -> its declared zset
for v in string.gmatch(ARGV[4], '%d+') do
  n = n + 1
  by_version[v] = KEYS[3 + n]
end

-- A worker's entries, in all three places.
local function forget(worker)
  local known = redis.call('HGET', accepts, worker)
  if known then
    for v in string.gmatch(known, '%d+') do
      if by_version[v] then redis.call('ZREM', by_version[v], worker) end
    end
  end
  redis.call('ZREM', workers, worker)
  redis.call('HDEL', accepts, worker)
  redis.call('HDEL', info, worker)
end

for _, worker in ipairs(redis.call('ZRANGEBYSCORE', workers, '-inf', '(' .. now, 'LIMIT', 0, 100)) do
  forget(worker)
end

if versions == '' then
  forget(id)
else
  local expiry = now + window
  redis.call('ZADD', workers, expiry, id)
  redis.call('HSET', accepts, id, versions)
  redis.call('HSET', info, id, ARGV[5])
  for v in string.gmatch(versions, '%d+') do redis.call('ZADD', by_version[v], expiry, id) end
end
return redis.call('ZCARD', workers)
