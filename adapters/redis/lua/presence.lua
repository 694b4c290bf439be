-- presence.lua: [door] a worker process says it is alive and which contract
-- versions it accepts (adapters/dramatiq/presence.py, every few seconds), or
-- that it leaves. enqueue.lua reads it to refuse work no live worker can run.
--
-- KEYS[1] P:workers           zset  worker id -> expiry ms
-- KEYS[2] P:workers:accepts   hash  worker id -> accepted versions, e.g. "1,2"
-- ARGV[1] worker id  ARGV[2] accepted versions ('' = the worker leaves)
-- ARGV[3] liveness window ms  ARGV[4] 'P:workers:v' (+ a version: that
-- version's zset, worker id -> expiry, so that enqueue.lua's check costs one
-- ZCOUNT whatever the number of workers)
--
-- The expiry is the server's clock + the window: liveness never compares
-- clocks of different hosts (worker, HTTP, Redis). Expired entries of any
-- worker (a SIGKILLed one) are pruned here, at most 100 per call.
--
-- Returns the number of live workers after this call.

local workers, accepts = KEYS[1], KEYS[2]
local id, versions, window, by_version = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = server_ms()

-- A worker's entries, in all three places.
local function forget(worker)
  local known = redis.call('HGET', accepts, worker)
  if known then
    for v in string.gmatch(known, '%d+') do redis.call('ZREM', by_version .. v, worker) end
  end
  redis.call('ZREM', workers, worker)
  redis.call('HDEL', accepts, worker)
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
  for v in string.gmatch(versions, '%d+') do redis.call('ZADD', by_version .. v, expiry, id) end
end
return redis.call('ZCARD', workers)
