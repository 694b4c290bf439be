-- retain_drop.lua: the second script of a retention pass: remove finished
-- job records that retain_index.lua picked, with everything that goes with
-- a record: its upload, its rejection report, [console] its event stream and
-- its entries in the owner's indexes. The done marker, receipt and journal
-- are never touched (the durable history).
--
-- KEYS[1] P:jobs:completed   KEYS[2] P:jobs:failed   KEYS[3] P:jobs:finished:new
-- KEYS[4] onwards: per job of ARGV[1] onwards, in order, seven keys:
--   P:job:<jobId>, P:events:<jobId>, P:job:<jobId>:rejections,
--   P:upload:<uploadId> (P:job:<jobId> again when the record names none),
--   P:jobs:owner:<owner>, P:jobs:completed:<owner>, P:jobs:failed:<owner>
-- ARGV[1] onwards: per job five values: jobId, 'completed' | 'failed' (the
--   all-owner index it was picked from), its score there when picked, and
--   the record's uploadId and owner as the caller read them just before ('' none)
--
-- A job is removed only when it is still in that index with that score (not
-- retried and finished again since) and its record, if any, is still final
-- with that uploadId and owner; else it is left for a later pass.
-- Returns how many jobs were removed.

local removed = 0
local first = 1
for i = 0, (#ARGV - first + 1) / 5 - 1 do
  local a, k = first + 5 * i, 4 + 7 * i
  local job_id, kind, score, upload_id, owner = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local index = (kind == 'completed') and KEYS[1] or KEYS[2]
  if redis.call('ZSCORE', index, job_id) == score then
    local rec = redis.call('HMGET', KEYS[k], 'state', 'uploadId', 'owner')
    if not rec[1] or (is_finished(rec[1]) and (rec[2] or '') == upload_id and (rec[3] or '') == owner) then
      if upload_id ~= '' then redis.call('DEL', KEYS[k + 3]) end
      redis.call('DEL', KEYS[k], KEYS[k + 1], KEYS[k + 2])
      redis.call('ZREM', index, job_id)
      redis.call('ZREM', KEYS[3], job_id)
      redis.call('ZREM', KEYS[k + 4], job_id)
      redis.call('ZREM', KEYS[k + 5], job_id)
      redis.call('ZREM', KEYS[k + 6], job_id)
      removed = removed + 1
    end
  end
end
return removed
