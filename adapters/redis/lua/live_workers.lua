-- live_workers.lua: every live worker and the contract versions it accepts,
-- as enqueue.lua's door check sees them (presence.lua writes them).
--
-- KEYS[1] P:workers (id -> expiry ms)   KEYS[2] P:workers:accepts (id -> "1,2")
--
-- Returns {id, accepts, id, accepts, ...} of the workers whose expiry, on the
-- server's clock, is not past. (One script, not a pipeline with TIME: a Redis
-- Cluster pipeline cannot carry a command without a key.)

local live = redis.call('ZRANGEBYSCORE', KEYS[1], server_ms(), '+inf')
local out = {}
if #live == 0 then return out end
local accepts = redis.call('HMGET', KEYS[2], unpack(live))
for i, id in ipairs(live) do
  if accepts[i] then
    out[#out + 1] = id
    out[#out + 1] = accepts[i]
  end
end
return out
