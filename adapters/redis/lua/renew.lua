-- renew.lua: a running attempt renews its lease on the job.
--
-- KEYS[1] P:job:<jobId>   KEYS[2] P:jobs:deadline
-- ARGV[1] jobId  ARGV[2] the attempt's fencing token  ARGV[3] lease ms
--
-- Only the attempt holding the job (active, same token) renews it, and never
-- past leaseCap (attempt start + time limit + stall margin, set by start.lua):
-- an attempt stuck where dramatiq's TimeLimit cannot reach still loses the job.
-- Returns 1 when renewed, 0 when the attempt no longer holds the job.

local state, token, cap = unpack(redis.call('HMGET', KEYS[1], 'state', 'token', 'leaseCap'))
if state ~= 'active' or token ~= ARGV[2] then return 0 end
local deadline = math.min(server_ms() + tonumber(ARGV[3]), tonumber(cap))
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
return 1
