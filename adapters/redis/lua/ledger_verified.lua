-- ledger_verified.lua: renew start.lua's gate at one location (adapters/redis/sync.py):
-- P:stats ledger:verifiedUntil = this server's clock + ARGV[2] ms, and
-- ledger:verifiedRun = this server's run_id.
--
-- ARGV[1] 'verified': the check just found this Redis at or ahead of the ledger;
--         'steady': the ledger did not answer; renewed only while the server is the
--         one last verified (same run_id): a Redis restarted on an older snapshot, or a
--         replica promoted, is a new run_id, and stays closed until the ledger answers.
-- KEYS[1] P:stats
-- Returns 1 when renewed, else 0.
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if ARGV[1] ~= 'verified' and redis.call('HGET', KEYS[1], 'ledger:verifiedRun') ~= run_id then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'ledger:verifiedUntil', now + tonumber(ARGV[2]), 'ledger:verifiedRun', run_id)
return 1
