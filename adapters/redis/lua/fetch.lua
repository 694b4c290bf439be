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
-- ARGV[1..9] dramatiq's dispatch arguments for 'fetch' (command .. prefetch), KEYS[1] its namespace
-- ARGV[10] 'P:upload:'   ARGV[11] largest upload handed over, in bytes (0: none)
-- ARGV[12] the import actor's name
-- ARGV[13] ARGV[14] the two halves of another location's upload prefix around
--   its name ('{importer@', '}:upload:'), or '' '' for main's jobs only: on a
--   Redis Cluster another location's keys are in another slot (maybe on
--   another node), where this script cannot read; on one node it can.
--
-- Returns {messages as dramatiq's fetch returns them, redis_message_ids, uploads}
-- (the last two side by side, only for the messages whose upload came along).

local messages = dramatiq_dispatch()
if type(messages) ~= 'table' then messages = {} end
local ids, uploads = {}, {}
local upload_prefix, max_bytes, actor = ARGV[10], tonumber(ARGV[11]), ARGV[12]
local head, tail = ARGV[13], ARGV[14]
if ARGV[1] == 'fetch' and max_bytes > 0 then
  for _, data in ipairs(messages) do
    local ok, m = false, nil
    if data then ok, m = pcall(cjson.decode, data) end
    if ok and type(m) == 'table' and m['actor_name'] == actor and type(m['options']) == 'table'
        and type(m['args']) == 'table' and type(m['args'][1]) == 'table' then
      local id, upload_id, job_id = m['options']['redis_message_id'], m['args'][1]['uploadId'], m['args'][1]['jobId']
      local prefix = upload_prefix
      local at = type(job_id) == 'string' and string.find(job_id, '@', 1, true)
      if at then prefix = (head ~= '') and (head .. string.sub(job_id, at + 1) .. tail) or nil end
      if prefix and type(id) == 'string' and type(upload_id) == 'string'
          and redis.call('STRLEN', prefix .. upload_id) <= max_bytes then
        local csv = redis.call('GET', prefix .. upload_id)
        if csv then
          ids[#ids + 1] = id
          uploads[#uploads + 1] = csv
        end
      end
    end
  end
end
return {messages, ids, uploads}
