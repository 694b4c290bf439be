-- common.lua: helpers prepended to every Importer script (see adapters/scripts.py).
--
-- Key layout, all under one prefix P that carries a hash tag, e.g. "{importer}:",
-- so that every key below hashes to one Redis Cluster slot:
--   P:stock                 hash    sku -> units on hand
--   P:generation            string  bumped once per applied shipment
--   P:done:<batchId>        hash    done marker: result, contentSha256, owner, appliedAt, jobId (kept forever)
--   P:journal               stream  one entry per applied shipment (kept forever)
--   P:job:<jobId>           hash    job record (removed by retention)
--   P:upload:<uploadId>     string  the uploaded CSV bytes (removed with its job, or on completion)
--   P:jobs:unsent           zset    jobId -> createdAt, recorded but message not yet confirmed sent
--   P:jobs:waiting          zset    jobId -> createdAt, waiting for its first attempt
--   P:jobs:active           zset    jobId -> startedAt of the current attempt
--   P:jobs:completed        zset    jobId -> finishedAt (retention index)
--   P:jobs:failed           zset    jobId -> finishedAt (retention index)
--   P:events                stream  every job change (approximate MAXLEN)
--   P:events:<jobId>        stream  [console] the same entries for one job, under the same ids as in
--                                   P:events (GET /api/imports/{jobId}/events reads it); removed with the record
--   P:jobs:owner:<owner>    zset    [console] jobId -> createdAt, one owner's job records (GET /api/imports);
--                                   written by enqueue.lua, removed with the record by retention
--   P:stats                 hash    queue-wide counters for /metrics (completed, failed:<code>,
--                                   retries, rows_applied, replays, duration buckets)
--   P:rate:<owner>:<window> string  POSTs of one owner in one rate-limit window (expires)
--
-- Time: enqueue.lua uses the caller's clock (createdAt, rate-limit window);
-- start, apply and fail use the server's (server_ms), so that an attempt's
-- timestamps and duration are measured by one clock.
--
-- Retention deletes job and upload keys it finds in the retention indexes.
-- Those keys are built from P inside the script rather than passed in KEYS:
-- their names are only known once the index is read. They share P's hash
-- tag, so they live in the same slot as every declared key.

-- Each event goes to P:events and [console] to P:events:<jobId> under the
-- same id, so that a stream of one job reads only its own entries. pcall:
-- that second write must never abort the script after the first one.
local JOB_EVENTS_MAXLEN = 64
local function emit(events_key, maxlen, kind, job_id, batch_id, attempt, data)
  local id = redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
    'event', kind, 'jobId', job_id, 'batchId', batch_id,
    'attempt', attempt, 'data', data)
  redis.pcall('XADD', events_key .. ':' .. job_id, 'MAXLEN', JOB_EVENTS_MAXLEN, id,
    'event', kind, 'jobId', job_id, 'batchId', batch_id,
    'attempt', attempt, 'data', data)
end

-- Remove finished job records older than age_ms, then all but the newest
-- `count`. Bounded work per call (at most 2 x 1000 records); the rest goes on
-- the next state change.
local function retain(index_key, prefix, now, age_ms, count)
  local victims = redis.call('ZRANGEBYSCORE', index_key, '-inf', '(' .. (now - age_ms), 'LIMIT', 0, 1000)
  local function drop(id)
    local job_key = prefix .. 'job:' .. id
    local upload_id = redis.call('HGET', job_key, 'uploadId')
    if upload_id then redis.call('DEL', prefix .. 'upload:' .. upload_id) end
    -- [console] the owner's index entry and the job's own event stream go with the record
    local owner = redis.call('HGET', job_key, 'owner')
    if owner then redis.call('ZREM', prefix .. 'jobs:owner:' .. owner, id) end
    redis.call('DEL', prefix .. 'events:' .. id)
    redis.call('DEL', job_key)
    redis.call('ZREM', index_key, id)
  end
  for _, id in ipairs(victims) do drop(id) end
  local extra = redis.call('ZCARD', index_key) - count
  if extra > 0 then
    if extra > 1000 then extra = 1000 end
    for _, id in ipairs(redis.call('ZRANGE', index_key, 0, extra - 1)) do drop(id) end
  end
end

local function is_finished(state)
  return state == 'completed' or state == 'failed'
end

-- Queue-wide counters, read by GET /metrics. The stats key is derived from
-- the prefix like the retention keys above (same hash tag, same slot).
local DURATION_BUCKETS_MS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000}

local function count(prefix, field, by)
  redis.call('HINCRBY', prefix .. 'stats', field, by or 1)
end

local function count_failed(prefix, error_json)
  local ok, decoded = pcall(cjson.decode, error_json)
  local code = (ok and type(decoded) == 'table' and decoded['code']) or 'unknown'
  count(prefix, 'failed:' .. code)
end

-- One observation of an attempt's duration (active -> finished), as a
-- Prometheus histogram: the smallest bucket it fits, made cumulative at scrape.
local function observe_duration(prefix, ms)
  local bucket = '+Inf'
  for _, le in ipairs(DURATION_BUCKETS_MS) do
    if ms <= le then bucket = tostring(le) break end
  end
  local key = prefix .. 'stats'
  redis.call('HINCRBY', key, 'duration_le:' .. bucket, 1)
  redis.call('HINCRBY', key, 'duration_sum_ms', ms)
end

-- Milliseconds from the server's clock (TIME is allowed in scripts since
-- Redis 5, which replicates effects rather than scripts).
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
