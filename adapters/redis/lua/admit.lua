-- admit.lua: the control partition's part of a POST (or a retry) for a location
-- other than main, whose job lives in another partition (another hash tag:
-- on a Redis Cluster, maybe another node). Run before enqueue.lua / retry.lua
-- there, which then take no rate token and find no workers in their own
-- partition (the door check is here). main's POSTs do all of this inside
-- enqueue.lua, in one step.
--
-- KEYS[1] P:rate:<owner>:<window>   [rate] the owner's fixed-window counter (all locations)
-- KEYS[2] P:workers  KEYS[3] P:workers:accepts  KEYS[4] P:workers:v<ARGV[3]>   [door]
-- KEYS[5] P:locations   KEYS[6] P:locations:owner:<owner>   [locations] the declared locations, the owner's
-- ARGV[1] the rate limit to take a token of here, 0 = not here   ARGV[2] the counter's expiry ms
-- ARGV[3] the contract version of the message this producer sends   ARGV[4] the location
-- KEYS[7] P:intake:paused   [ops] ARGV[5] '1': a new upload (a POST), refused while an operator
--   paused intake at this location or everywhere ('*'); '' for a retry, which adds no shipment
--
-- Returns {'ok'} | {'undeclared'} | {'paused'} | {'rate_limited'} | {'no_worker', '1,3'}
--   A location no operator declared (`importer locations add`, IMPORTER_LOCATIONS)
--   is refused first, with nothing written: no token, no registry entry, so
--   that nobody can grow the per-location costs (reconciler, observer, metrics).
--   Then, as in enqueue.lua: the token (a replay counts too), then the door.
--   Unlike a POST to main, a replay of a known job is also refused by a closed
--   door: this step cannot see the job. The owner's registry gets the location
--   before the job is recorded, so the owner's list never misses one.

if redis.call('SISMEMBER', KEYS[5], ARGV[4]) == 0 then return {'undeclared'} end
if ARGV[5] == '1' and intake_paused(KEYS[7], ARGV[4]) then return {'paused'} end  -- [ops]
local rate_limit = tonumber(ARGV[1])
if rate_limit > 0 then
  local used = redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if used > rate_limit then return {'rate_limited'} end
end
local refused = no_worker_accepts(KEYS[2], KEYS[3], KEYS[4], ARGV[3])
if refused then return {'no_worker', refused} end
redis.call('SADD', KEYS[6], ARGV[4])
return {'ok'}
