-- read_rejections.lua: a job's rejection report, for its owner only.
--
-- KEYS[1] P:job:<jobId>   KEYS[2] P:job:<jobId>:rejections
-- ARGV[1] owner
--
-- As read_owned.lua: only the owner field is read before deciding, so a
-- missing record and another owner's take the same path and return the same
-- empty reply. The report is read only for a failed job.
--
-- Returns {} unless the record's owner is ARGV[1]; else {state, error JSON
-- or '', report JSON or ''}.

if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {} end
local rec = redis.call('HMGET', KEYS[1], 'state', 'error')
if rec[1] ~= 'failed' then return {rec[1] or '', rec[2] or '', ''} end
return {rec[1], rec[2] or '', redis.call('GET', KEYS[2]) or ''}
