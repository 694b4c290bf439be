-- reconcile_due.lua: the first step of a reconciler pass over one partition:
-- which jobs are due, and whether the store was away since the last pass.
-- It reads and writes only these declared keys; reconcile.lua then acts on
-- the due jobs, with each job's own keys declared.
--
-- KEYS[1] P:jobs:unsent  KEYS[2] P:jobs:deadline  KEYS[3] P:reconciler:pass
-- ARGV[1] waiting grace ms  ARGV[2] max jobs per list  ARGV[3] outage gap ms
--
-- Returns {after_outage (1|0), {jobIds recorded but not confirmed sent, past
-- createdAt + grace}, {jobIds past their deadline}} (the server's clock); the
-- pass's time is recorded (reconcile.lua, "Blame").

local grace, limit, gap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = server_ms()
local last_pass = tonumber(redis.call('GET', KEYS[3]) or '0')
redis.call('SET', KEYS[3], now)
return {
  (now - last_pass > gap) and 1 or 0,
  redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - grace, 'LIMIT', 0, limit),
  redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit),
}
