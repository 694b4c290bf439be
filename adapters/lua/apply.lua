-- apply.lua: apply one validated shipment to stock exactly once, atomically,
-- and complete (or fail) its job in the same step.
--
-- KEYS[1] P:stock            KEYS[2] P:generation      KEYS[3] P:done:<batchId>
-- KEYS[4] P:journal          KEYS[5] P:job:<jobId>     KEYS[6] P:events
-- KEYS[7] P:jobs:active      KEYS[8] P:jobs:completed  KEYS[9] P:jobs:failed
-- KEYS[10] P:upload:<uploadId>
-- ARGV[1] jobId  ARGV[2] batchId  ARGV[3] contentSha256  ARGV[4] owner
-- ARGV[5] nowMs (unused: timestamps come from the server's TIME)  ARGV[6] attempt  ARGV[7] maxStock  ARGV[8] events maxlen
-- ARGV[9] prefix  ARGV[10] keepCompletedAgeMs  ARGV[11] keepCompletedCount
-- ARGV[12] keepFailedAgeMs  ARGV[13] keepFailedCount
-- ARGV[14] public error JSON for a conflict  ARGV[15] ... for an overflow
-- ARGV[16], ARGV[17], ...  sku, quantity pairs (validated by domain/shipment.py)
--
-- The rule is domain/stock.py's apply_shipment:
--   done marker with the same hash -> replay: stored result, replay=true, no change
--   done marker with another hash  -> conflict: job failed, no change
--   any SKU would exceed maxStock   -> overflow: job failed, no change
--   otherwise add every quantity, bump generation, write the done marker,
--   append to the journal, complete the job. Nothing partial is ever visible.
--
-- Returns {'applied', resultJson} | {'replayed', resultJson} | {'conflict'}
--       | {'overflow', sku} | {'finished', state} | {'missing'}

local job_key = KEYS[5]
local job_id, batch_id, sha, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, attempt, max_stock, maxlen, prefix = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[8], ARGV[9]
-- The server's clock, not the caller's: finishedAt and the attempt's
-- duration then include the time this script took (large batches).
now = server_ms()
local first_pair = 16
local rows = (#ARGV - first_pair + 1) / 2

local state, attempt_started = unpack(redis.call('HMGET', job_key, 'state', 'attemptStartedAt'))
if not state then return {'missing'} end
if is_finished(state) then return {'finished', state} end

local function fail(error_json, diagnostic)
  redis.call('HSET', job_key, 'state', 'failed', 'error', error_json, 'diagnostic', diagnostic,
    'finishedAt', now, 'updatedAt', now)
  redis.call('ZREM', KEYS[7], job_id)
  redis.call('ZADD', KEYS[9], now, job_id)
  emit(KEYS[6], maxlen, 'failed', job_id, batch_id, attempt, error_json)
  retain(KEYS[9], prefix, now, tonumber(ARGV[12]), tonumber(ARGV[13]))
  count_failed(prefix, error_json)
end

local function complete(result_json)
  local progress = '{"phase":"committed","rows":' .. rows .. '}'
  redis.call('HSET', job_key, 'state', 'completed', 'progress', progress, 'result', result_json,
    'error', '', 'finishedAt', now, 'updatedAt', now)
  redis.call('DEL', KEYS[10])
  redis.call('ZREM', KEYS[7], job_id)
  redis.call('ZADD', KEYS[8], now, job_id)
  emit(KEYS[6], maxlen, 'progress', job_id, batch_id, attempt, progress)
  emit(KEYS[6], maxlen, 'completed', job_id, batch_id, attempt, result_json)
  retain(KEYS[8], prefix, now, tonumber(ARGV[10]), tonumber(ARGV[11]))
  count(prefix, 'completed')
  if attempt_started then observe_duration(prefix, now - tonumber(attempt_started)) end
end

local done = redis.call('HMGET', KEYS[3], 'contentSha256', 'result')
if done[1] then
  if done[1] ~= sha then
    fail(ARGV[14], 'done marker of ' .. batch_id .. ' has another content hash')
    return {'conflict'}
  end
  local result = cjson.decode(done[2])
  result['replay'] = true
  local result_json = cjson.encode(result)
  complete(result_json)
  count(prefix, 'replays')
  return {'replayed', result_json}
end

-- Check every row before changing anything (HMGET in chunks: unpack()
-- has a stack limit of a few thousand values).
local CHUNK = 4000
for start = first_pair, #ARGV, 2 * CHUNK do
  local skus = {}
  local last = math.min(start + 2 * CHUNK - 1, #ARGV)
  for i = start, last, 2 do skus[#skus + 1] = ARGV[i] end
  local current = redis.call('HMGET', KEYS[1], unpack(skus))
  for j, sku in ipairs(skus) do
    local i = start + 2 * (j - 1)
    if tonumber(current[j] or '0') + tonumber(ARGV[i + 1]) > max_stock then
      fail(ARGV[15], 'sku ' .. sku .. ' would exceed ' .. ARGV[7])
      return {'overflow', sku}
    end
  end
end

for i = first_pair, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('INCR', KEYS[2])
local result_json = '{"imported":' .. rows .. ',"batchId":' .. cjson.encode(batch_id) .. '}'
redis.call('HSET', KEYS[3], 'batchId', batch_id, 'contentSha256', sha, 'result', result_json,
  'owner', owner, 'appliedAt', now, 'jobId', job_id)
redis.call('XADD', KEYS[4], '*', 'batchId', batch_id, 'jobId', job_id, 'owner', owner,
  'contentSha256', sha, 'appliedAt', now, 'result', result_json)
complete(result_json)
count(prefix, 'rows_applied', rows)
return {'applied', result_json}
