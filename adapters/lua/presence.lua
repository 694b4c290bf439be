-- presence.lua: [door] a worker process says it is alive and which contract
-- versions it accepts (adapters/worker_presence.py, every few seconds), or
-- that it leaves. enqueue.lua reads it to refuse work no live worker can run.
--
-- KEYS[1] P:workers           zset  worker id -> expiry ms
-- KEYS[2] P:workers:accepts   hash  worker id -> accepted versions, e.g. "1,2"
-- ARGV[1] worker id  ARGV[2] accepted versions ('' = the worker leaves)
-- ARGV[3] liveness window ms
--
-- The expiry is the server's clock + the window: liveness never compares
-- clocks of different hosts (worker, HTTP, Redis). Expired entries of any
-- worker (a SIGKILLed one) are pruned here, at most 100 per call.
--
-- Returns the number of live workers after this call.

local workers, accepts = KEYS[1], KEYS[2]
local id, versions, window = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = server_ms()

local expired = redis.call('ZRANGEBYSCORE', workers, '-inf', '(' .. now, 'LIMIT', 0, 100)
if #expired > 0 then
  redis.call('ZREM', workers, unpack(expired))
  redis.call('HDEL', accepts, unpack(expired))
end

if versions == '' then
  redis.call('ZREM', workers, id)
  redis.call('HDEL', accepts, id)
else
  redis.call('ZADD', workers, now + window, id)
  redis.call('HSET', accepts, id, versions)
end
return redis.call('ZCARD', workers)
