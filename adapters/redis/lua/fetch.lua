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
--
-- Returns {messages as dramatiq's fetch returns them, redis_message_ids, uploads}
-- (the last two side by side, only for the messages whose upload came along).

local messages = dramatiq_dispatch()
if type(messages) ~= 'table' then messages = {} end
local ids, uploads = {}, {}
local upload_prefix, max_bytes, actor = ARGV[10], tonumber(ARGV[11]), ARGV[12]
if ARGV[1] == 'fetch' and max_bytes > 0 then
  for _, data in ipairs(messages) do
    local ok, m = false, nil
    if data then ok, m = pcall(cjson.decode, data) end
    if ok and type(m) == 'table' and m['actor_name'] == actor and type(m['options']) == 'table'
        and type(m['args']) == 'table' and type(m['args'][1]) == 'table' then
      local id, upload_id = m['options']['redis_message_id'], m['args'][1]['uploadId']
      if type(id) == 'string' and type(upload_id) == 'string'
          and redis.call('STRLEN', upload_prefix .. upload_id) <= max_bytes then
        local csv = redis.call('GET', upload_prefix .. upload_id)
        if csv then
          ids[#ids + 1] = id
          uploads[#uploads + 1] = csv
        end
      end
    end
  end
end
return {messages, ids, uploads}
