-- progress.lua: record a real milestone of the current attempt.
--
-- KEYS[1] P:job:<jobId>   KEYS[2] P:events
-- ARGV[1] jobId  ARGV[2] nowMs  ARGV[3] progress JSON  ARGV[4] attempt  ARGV[5] events maxlen
-- ARGV[6] the attempt's fencing token (start.lua)
--
-- Ignored (returns 0) unless the job is active in this very attempt (same
-- attempt and same token), so a late write from an older attempt cannot
-- overwrite a newer one.

local rec = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'batchId', 'token')
if rec[1] ~= 'active' or rec[2] ~= ARGV[4] or (rec[4] or '') ~= (ARGV[6] or '') then return 0 end
redis.call('HSET', KEYS[1], 'progress', ARGV[3], 'updatedAt', ARGV[2])
emit(KEYS[2], ARGV[5], 'progress', ARGV[1], rec[3], ARGV[4], ARGV[3])
return 1
