-- apply.lua: apply one validated shipment to stock exactly once, atomically,
-- and complete (or fail) its job in the same step.
--
-- KEYS[1..7], ARGV[1..8]: the job-step header (common.lua), then
-- KEYS[8] P:stock   KEYS[9] P:generation   KEYS[10] P:done:<batchId>   KEYS[11] P:journal
-- KEYS[12] P:jobs:completed   KEYS[13] P:upload:<uploadId>   KEYS[14] P:jobs:deadline
-- KEYS[15] P:receipt:<batchId>   KEYS[16] P:ledger:pruned  [ledger] done markers ever pruned here
-- KEYS[17] P:ledger:pruned:filter  [ledger] the batchIds whose marker was pruned (common.lua)
-- ARGV[9] batchId  ARGV[10] contentSha256  ARGV[11] owner  ARGV[12] attempt  ARGV[13] maxStock
-- ARGV[14..16] [ledger] the ledger's word on the batch, when the worker asked it
--   (after an 'ask_ledger' reply): the P:ledger:pruned value it read before
--   asking ('' = not asked), then the archived shipment's contentSha256 and
--   result JSON ('' '' = the ledger does not hold the batch)
-- ARGV[17] public error JSON for a conflict  ARGV[18] ... for an overflow
-- ARGV[19] the attempt's fencing token (start.lua): the apply and the job's
--          completion take effect only while the job is active under it
-- ARGV[20] the progress JSON of the 'validated' milestone ({"phase":"validated","rows":n})
-- ARGV[21] onwards: sku, quantity pairs (validated by domain/shipment.py)
--
-- Once the fencing check passes, the 'validated' milestone (validation
-- finished in the worker before this call) is emitted first, as its own
-- progress event, then 'committed' and 'completed' (or 'failed'): the events
-- the observer expects, in one script call instead of two.
--
-- The rule is domain/stock.py's apply_shipment:
--   done marker with the same hash -> replay: stored result, replay=true, no change
--   done marker with another hash  -> conflict: job failed, no change
--   any SKU would exceed maxStock   -> overflow: job failed, no change
--   [ledger] no done marker, the batch in the filter of pruned batchIds, and
--   done markers pruned here since the ledger was last asked
--   -> {'ask_ledger', pruned}: nothing changed; the
--   worker asks the ledger and calls again with its word (ARGV[14..16])
--   archived in the ledger (ARGV[15]) -> as a done marker: replay or conflict
--   otherwise add every quantity, bump generation, write the done marker and
--   the receipt, append to the journal, complete the job. Nothing partial is
--   ever visible. A replay leaves the receipt as the first application wrote it.
--
-- Timestamps come from the server's clock (job_step), read once: inside a
-- script valkey freezes TIME at the script's start (redis 7.0 mostly does
-- too), so a script's effects share one instant. For a large shipment the
-- appliedAt, finishedAt and attempt duration are therefore those of the
-- moment its apply began: a 100,000-row apply runs ~0.2 s past them.
--
-- Returns {'ask_ledger', pruned} | {'applied', resultJson} | {'replayed', resultJson} | {'conflict'}
--       | {'overflow', sku} | {'finished', state} | {'missing'}
--       | {'stale', state}: a newer attempt holds the job (or the reconciler
--         took it back); nothing changed

-- started: given by start_apply.lua, the attempt its start step just began
-- ({now, token, record}): the clock and the fencing check need no second read,
-- the job was never put in P:jobs:active (start.lua), so it is not taken out,
-- and the start's fields of the record (record: attempt, token...) are written
-- here, in the one HSET that ends the attempt (completed or failed).
local started = COMBINED
local step = job_step(KEYS, ARGV, started and started.now)
local job_key, job_id, now = step.key, step.id, step.now
local batch_id, sha, owner, attempt = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local max_stock = tonumber(ARGV[13])
local first_pair = 21
local validated = ARGV[20]
local rows = (#ARGV - first_pair + 1) / 2

local state, token, attempt_started
if started then
  state, token, attempt_started = 'active', started.token, started.now
else
  state, token, attempt_started = unpack(redis.call('HMGET', job_key, 'state', 'token', 'attemptStartedAt'))
end
step.attempt_started = attempt_started
if not state then return {'missing'} end
if is_finished(state) then return {'finished', state} end
if state ~= 'active' or (token or '') ~= ARGV[19] then return {'stale', state} end

-- [ledger] The door (docs/reliability.md, "The ledger"): a done marker leaves
-- Redis only once the ledger holds its batch, past the idempotency horizon,
-- with no job record of its batch left (ledger_prune.lua, which counts each
-- pruning in P:ledger:pruned). This job's record exists, so no marker of its
-- batch can leave while it runs; a marker pruned before the worker asked the
-- ledger is in the ledger's answer. An answer given before a later pruning
-- is asked again.
local done = redis.call('HMGET', KEYS[10], 'contentSha256', 'result')
if not done[1] then
  local archived_sha, archived_result
  if started then
    -- start_apply.lua let the batch through the door itself: nothing its call
    -- writes before this apply changes the door's answer.
    archived_sha, archived_result = started.ledger[2], started.ledger[3]
  else
    archived_sha, archived_result = ARGV[15], ARGV[16]
    local pruned = redis.call('GET', KEYS[16])  -- false when no marker was ever pruned here
    if pruned and pruned ~= ARGV[14] and maybe_pruned(KEYS[17], batch_id) then return {'ask_ledger', pruned} end
  end
  if archived_sha ~= '' then done = {archived_sha, archived_result} end
end
zrem(KEYS[14], job_id)
emit(step.events, step.job_events, step.maxlen, 'progress', job_id, batch_id, attempt, validated)

local start_fields = (started and started.record) or {}
local function fail(error_json, diagnostic)
  redis.call('HSET', job_key, 'progress', validated, unpack(start_fields))
  mark_failed(step, batch_id, attempt, error_json, diagnostic)
end

local function complete(result_json)
  local progress = '{"phase":"committed","rows":' .. rows .. '}'
  -- The content key stays with the record its upload leaves (enqueue.lua compares a re-POST with it).
  redis.call('HSET', job_key, 'state', 'completed', 'progress', progress, 'result', result_json,
    'error', '', 'finishedAt', now, 'updatedAt', now, 'contentSha256', sha, unpack(start_fields))
  del(KEYS[13])
  if not started then zrem(step.active, job_id) end
  index_finished(step, KEYS[12])
  emit(step.events, step.job_events, step.maxlen, 'progress', job_id, batch_id, attempt, progress)
  emit(step.events, step.job_events, step.maxlen, 'completed', job_id, batch_id, attempt, result_json)
  count(step.stats, 'completed')
  observe_duration(step)
end

if done[1] then
  if done[1] ~= sha then
    fail(ARGV[17], 'done marker of ' .. batch_id .. ' has another content hash')
    return {'conflict'}
  end
  local result = cjson.decode(done[2])
  result['replay'] = true
  local result_json = cjson.encode(result)
  complete(result_json)
  count(step.stats, 'replays')
  return {'replayed', result_json}
end

-- Check every row before changing anything (HMGET in chunks: unpack()
-- has a stack limit of a few thousand values).
-- The same pass makes the receipt (domain/receipt.py): 'sku,before,quantity\n'
-- per row, in file order, from HMGET's replies as they are (SKUs are distinct
-- in a shipment, so they are the stock just before): strings only, joined by
-- table.concat in C; formatting numbers in Lua would cost +50% here.
local CHUNK = 4000
local receipt, lines = {}, {}
-- The stock after, per chunk, as HSET's field/value pairs: the new values are
-- known here (before + quantity; SKUs are distinct), so the write below is one
-- HSET per chunk instead of one HINCRBY per row. '%d' formats exactly up to
-- 2^63 (Lua numbers are doubles, exact up to 2^53; stock is at most maxStock).
local updates = {}
for start = first_pair, #ARGV, 2 * CHUNK do
  local skus = {}
  local last = math.min(start + 2 * CHUNK - 1, #ARGV)
  for i = start, last, 2 do skus[#skus + 1] = ARGV[i] end
  local current = redis.call('HMGET', KEYS[8], unpack(skus))
  local n, fields = 0, {}
  for j, sku in ipairs(skus) do
    local i = start + 2 * (j - 1)
    local before = current[j] or '0'
    local after = tonumber(before) + tonumber(ARGV[i + 1])
    if after > max_stock then
      fail(ARGV[18], 'sku ' .. sku .. ' would exceed ' .. ARGV[13])
      return {'overflow', sku}
    end
    lines[n + 1], lines[n + 2], lines[n + 3], lines[n + 4], lines[n + 5], lines[n + 6] =
      sku, ',', before, ',', ARGV[i + 1], '\n'
    n = n + 6
    -- at most CHUNK / 2 pairs per HSET: unpack()'s limit counts values, not pairs
    if #fields == CHUNK then updates[#updates + 1] = fields; fields = {} end
    fields[#fields + 1], fields[#fields + 2] = sku, string.format('%d', after)
  end
  receipt[#receipt + 1] = table.concat(lines, '', 1, n)
  if #fields > 0 then updates[#updates + 1] = fields end
end

for _, chunk in ipairs(updates) do
  redis.call('HSET', KEYS[8], unpack(chunk))
end
redis.call('SET', KEYS[15], table.concat(receipt))
incrby(KEYS[9], nil, 1)
local result_json = '{"imported":' .. rows .. ',"batchId":' .. cjson.encode(batch_id) .. '}'
redis.call('HSET', KEYS[10], 'batchId', batch_id, 'contentSha256', sha, 'result', result_json,
  'owner', owner, 'appliedAt', now, 'jobId', job_id)
redis.call('XADD', KEYS[11], '*', 'batchId', batch_id, 'jobId', job_id, 'owner', owner,
  'contentSha256', sha, 'appliedAt', now, 'result', result_json)
complete(result_json)
count(step.stats, 'rows_applied', rows)
return {'applied', result_json}
