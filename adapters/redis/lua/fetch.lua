-- fetch.lua: dramatiq's own fetch, plus the upload of each small import.
--
-- adapters/redis/scripts.py puts dramatiq's Redis broker script (its dispatch.lua,
-- from the installed dramatiq, unchanged) above this file as the function
-- dramatiq_dispatch(): the fetch (heartbeat, LPOP, the acks set, HMGET of the
-- messages, its occasional maintenance) is dramatiq's. Then, for each fetched
-- message of the import actor whose upload is at most ARGV[11] bytes, the
-- upload is read and returned beside it, so the worker can parse and validate
-- it before the attempt starts and run the attempt as one script
-- (start_apply.lua). Larger uploads are left where they are: start.lua hands
-- them over, and the separate steps let a person see 'validated' before a long apply.
--
-- ARGV[1..9] dramatiq's dispatch arguments for 'fetch' (command .. prefetch), KEYS[1] its namespace,
-- KEYS[2] the queue's list (declared only, so a migrating slot answers TRYAGAIN: LocationQueues.dispatch_keys)
-- ARGV[10] 'P:upload:' of the queue's location   ARGV[11] largest upload handed over, in bytes (0: none)
-- ARGV[12] the import actor's name
-- ARGV[13] ARGV[14] on one node, where main's queue holds every location's
--   messages: the two halves of another location's upload prefix around its
--   name ('{importer@', '}:upload:'), for the jobs whose id names a location.
--   '' '' on a Redis Cluster, where each location's queue is in its own
--   partition (LocationQueues): every upload is read under ARGV[10], in the
--   queue's slot. (A message of another location left in main's queue by an
--   older release finds no upload there and takes the separate steps.)
--
-- Returns {messages as dramatiq's fetch returns them, redis_message_ids, uploads,
-- jobIds, positions in messages} (the last four side by side, only for the
-- messages whose upload came along).

local messages = dramatiq_dispatch()
if type(messages) ~= 'table' then messages = {} end
local ids, uploads, jobs, positions = {}, {}, {}, {}
local upload_prefix, max_bytes, actor = ARGV[10], tonumber(ARGV[11]), ARGV[12]
local head, tail = ARGV[13], ARGV[14]
if ARGV[1] == 'fetch' and max_bytes > 0 then
  for position, data in ipairs(messages) do
    local ok, m = false, nil
    if data then ok, m = pcall(cjson.decode, data) end
    if ok and type(m) == 'table' and m['actor_name'] == actor and type(m['options']) == 'table'
        and type(m['args']) == 'table' and type(m['args'][1]) == 'table' then
      local id, upload_id, job_id = m['options']['redis_message_id'], m['args'][1]['uploadId'], m['args'][1]['jobId']
      local prefix = upload_prefix
      local at = type(job_id) == 'string' and string.find(job_id, '@', 1, true)
      if at and head ~= '' then prefix = head .. string.sub(job_id, at + 1) .. tail end
      if type(id) == 'string' and type(upload_id) == 'string' then
        -- At most max_bytes + 1 bytes of it: one more than the bound tells it is larger (uploads are never empty).
        local csv = redis.call('GETRANGE', prefix .. upload_id, 0, max_bytes)
        if csv ~= '' and #csv <= max_bytes then
          ids[#ids + 1] = id
          uploads[#uploads + 1] = csv
          jobs[#jobs + 1] = type(job_id) == 'string' and job_id or ''
          positions[#positions + 1] = position
        end
      end
    end
  end
end
return {messages, ids, uploads, jobs, positions}
