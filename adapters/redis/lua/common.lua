-- common.lua: helpers prepended to every Importer script (see adapters/redis/scripts.py,
-- which also writes DURATION_BUCKETS_MS above this file).
--
-- Key layout, all under one prefix P that carries a hash tag, e.g. "{importer}:",
-- so that every key below hashes to one Redis Cluster slot. The names are
-- made by the Keys class in adapters/redis/keys.py and reach the scripts as
-- KEYS (every one of them; see "Job steps" below):
--   P:stock                 hash    sku -> units on hand
--   P:generation            string  bumped once per applied shipment
--   P:done:<batchId>        hash    done marker: result, contentSha256, owner, appliedAt, jobId (kept forever
--                                   without a ledger; with one, until the idempotency horizon: ledger_prune.lua)
--   P:journal               stream  one entry per applied shipment: the ledger's outbox (kept forever without
--                                   a ledger; with one, until exported and past the hot window: ledger_trim.lua)
--   P:receipt:<batchId>     string  receipt: 'sku,before,quantity\n' per row in file order, written by apply.lua
--                                   with the done marker (never rewritten; domain/receipt.py; kept as the journal entry)
--   P:ledger:markers        zset    [ledger] batchId -> appliedAt: markers whose batch the ledger holds, to prune
--   P:ledger:pruned         string  [ledger] how many prunings of done markers happened here (apply.lua's door)
--   P:ledger:pruned:filter  string  [ledger] a Bloom filter (2^22 bits, 512 KiB) of the batchIds whose marker was
--                                   pruned here: a batch not in it never lost its marker (apply.lua's door)
--   P:job:<jobId>           hash    job record (removed by retention)
--   P:job:<jobId>:rejections string JSON {found, issues}: the located issues a failed validation
--                                   kept (its rejection report, fail.lua); removed with the record
--   P:upload:<uploadId>     string  the uploaded CSV bytes (removed with its job, or on completion)
--   P:jobs:unsent           zset    jobId -> createdAt, recorded but message not yet confirmed sent
--   P:jobs:waiting          zset    jobId -> createdAt, waiting for its first attempt
--   P:jobs:active           zset    jobId -> startedAt of the current attempt
--   P:jobs:completed        zset    jobId -> finishedAt (all owners: retention by age, metrics)
--   P:jobs:failed           zset    jobId -> finishedAt (all owners: retention by age, metrics)
--   P:jobs:completed:<owner> zset   jobId -> finishedAt (one owner's: retention by count)
--   P:jobs:failed:<owner>   zset    jobId -> finishedAt (one owner's: retention by count)
--   P:jobs:finished:new     zset    jobId -> finishedAt, finished but not yet in its owner's index
--                                   (the retention pass moves it there, retain_index.lua)
--   P:events                stream  every job change, one entry per job and script call (see emit
--                                   below; approximate MAXLEN)
--   P:events:<jobId>        stream  [console] the same entries for one job, under the same ids as in
--                                   P:events (see emit below;
--                                   GET /api/imports/{jobId}/events reads it); removed with the record
--   P:jobs:owner:<owner>    zset    [console] jobId -> createdAt, one owner's job records (GET /api/imports);
--                                   written by enqueue.lua, removed with the record by retention (retain_drop.lua)
--   P:stats                 hash    queue-wide counters for /metrics (completed, failed:<code>,
--                                   retries, rows_applied, replays, duration buckets); [ops] recent
--                                   failures by code and time bucket (count_recent_failure)
--   P:intake:paused         hash    [ops] control partition: location ('*': all) -> who paused its
--                                   intake, and when (JSON); enqueue.lua and admit.lua refuse new uploads
--   P:rate:<owner>:<window> string  POSTs of one owner in one rate-limit window (expires)
--   P:dramatiq:...          dramatiq's Redis broker (queues, delayed queues); no script touches them
--   P:jobs:deadline         zset    jobId -> deadline ms of every sent job not final yet (reconcile.lua)
--   P:fence                 string  the attempts' fencing tokens (INCR in start.lua)
--   P:reconciler:lock       string  one reconciler pass at a time (expires)
--   P:health                string  /health's write probe (expires)
--   P:workers               zset    [door] worker id -> expiry ms (server clock) of its last presence beat
--   P:workers:accepts       hash    [door] worker id -> the contract versions it accepts, e.g. "1,2"
--   P:workers:v<version>    zset    [door] worker id -> expiry ms, of the workers accepting that version
--                                   (all three written by presence.lua; read by enqueue.lua's door check)
--
-- Time: enqueue.lua uses the caller's clock (createdAt,
-- rate-limit window); start, apply and fail use the server's (server_ms), so
-- that an attempt's timestamps and duration are measured by one clock.
--
-- Job steps: start.lua, apply.lua and fail.lua change a job's state and share
-- their first KEYS and ARGV (read by job_step below), then add their own:
--   KEYS[1] P:job:<jobId>   KEYS[2] P:events   KEYS[3] P:jobs:active
--   KEYS[4] P:jobs:failed   KEYS[5] P:stats    KEYS[6] P:events:<jobId>
--   KEYS[7] P:jobs:finished:new
--   ARGV[1] jobId  ARGV[2] events maxlen  ARGV[3] start.lua's gate ('1' with a ledger; else '')
--   ARGV[4..8] '' (not read: they held retention's name prefixes and limits; kept so
--   that each step's own ARGV keep their numbers)
--
-- Every key a script reads or writes is in its KEYS (Redis Cluster's rule:
-- a slot can then move while the scripts run, see docs/scaling-out.md); no
-- script makes a key name. What a job step cannot know before it runs (the
-- owner of the job, the records retention removes) is left to the upkeep:
-- a job that becomes final enters P:jobs:finished:new, and the retention
-- pass (retain_index.lua, retain_drop.lua, called by adapters/redis/upkeep.py)
-- puts it in its owner's retention index and removes old records, each call
-- with every key it touches declared.

-- nil in a script run on its own; in a step that a combined script runs
-- (start_apply.lua), what that script hands it: the start learns that the
-- apply follows in the same call, the apply gets the start's clock and token.
local COMBINED = nil

local BATCH = nil  -- set by start_apply.lua for the imports of one call: see "Batched writes" below

-- Milliseconds from the server's clock (TIME is allowed in scripts since
-- Redis 5, which replicates effects rather than scripts); in a batch, the one
-- clock its call read.
local function server_ms()
  if BATCH then return BATCH.now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- keys, argv: the script's KEYS and ARGV (the default), or those a combined
-- script hands to a step it runs (start_apply.lua), with the time it read (now).
local function job_step(keys, argv, now)
  keys, argv = keys or KEYS, argv or ARGV
  return {
    key = keys[1], events = keys[2], active = keys[3], failed = keys[4], stats = keys[5],
    job_events = keys[6], finished_new = keys[7], id = argv[1], maxlen = argv[2],
    now = now or server_ms(),
  }
end

-- Events: emit() keeps each event of the call, and at the end of the call
-- (flush_events, which adapters/redis/scripts.py runs after every script)
-- each job's events of the call become ONE entry in P:events and the same
-- entry in the job's own stream P:events:<jobId> (job_events_key, declared
-- by the caller), so that a small import that ends in one call (active,
-- validated, committed, completed) costs one write to each, not four; a
-- stream of one job reads only its own entries.
--
-- Every event keeps an id of its own, ordered as the events were made: the
-- call gives its events consecutive stream ids after the newest entry of
-- P:events (as XADD '*' would, from the server's clock, server_ms: ms-0, ms-1, ... or,
-- within the newest entry's millisecond, its seq + 1, + 2, ...), and each
-- entry is written under the id of its job's LAST event of the call. Its
-- earlier events ride in the entry as numbered fields (event.1, attempt.1,
-- data.1, ...; the last event's as event, attempt, data), so an entry of one
-- event reads as it always did; an earlier event's attempt is left out when it
-- is the last event's (the common case). Their ids are implied, being consecutive: of
-- an entry of n events, the i-th has the entry's sequence number less n - i
-- (an entry under an id the server chose, below, names them: id.1, ...);
-- adapters/redis/records.py (stream_events) gives each event back under its own id, and a reader
-- resuming after an event inside an entry (SSE's Last-Event-ID, `importer
-- events --from`) reads that entry again and skips what it saw.
-- The job stream's write is a pcall: it must never abort the script after the others.
local JOB_EVENTS_MAXLEN = 64
local events_pending, events_order = {}, {}
local function emit(events_key, job_events_key, maxlen, kind, job_id, batch_id, attempt, data)
  local pending = events_pending[job_events_key]
  if not pending then
    pending = {events_key, maxlen, job_id, batch_id}
    events_pending[job_events_key] = pending
    events_order[#events_order + 1] = job_events_key
  end
  local n = #pending
  pending[n + 1], pending[n + 2], pending[n + 3] = kind, attempt, data
end

-- The numbered field names of the first earlier events, made once (making
-- them per entry, 'event.' .. i, costs more than the write).
local EARLIER_EVENT_FIELDS = {'event.1', 'attempt.1', 'data.1', 'event.2', 'attempt.2', 'data.2',
  'event.3', 'attempt.3', 'data.3'}

-- {ms, seq} of a stream id.
local function id_parts(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end

-- {ms, seq} of the id the call's next event takes after the newest entry of events_key.
local function first_free_id(events_key)
  local now = server_ms()
  local top = redis.call('XREVRANGE', events_key, '+', '-', 'COUNT', 1)[1]
  if top then
    local ms, seq = id_parts(top[1])
    if ms >= now then return {ms, seq + 1} end
  end
  return {now, 0}
end

local function flush_events()
  local free = {}  -- events key -> {ms, seq} of its next id, once the call wrote there
  for _, job_events_key in ipairs(events_order) do
    local p = events_pending[job_events_key]
    local events_key = p[1]
    local last = #p - 2  -- the last event's kind, then its attempt and data
    local count = (last - 2) / 3
    local args = {'XADD', events_key, 'MAXLEN', '~', p[2], '*', 'jobId', p[3], 'batchId', p[4],
      'event', p[last], 'attempt', p[last + 1], 'data', p[last + 2]}
    local n = 16
    local next_id = free[events_key]
    if count == 1 and not next_id then
      -- One event, the call's first entry there: the server's own id (a POST's 'waiting').
      local ms, seq = id_parts(redis.call(unpack(args, 1, n)))
      free[events_key] = {ms, seq + 1}
      args[6] = ms .. '-' .. seq
    else
      if not next_id then
        next_id = first_free_id(events_key)
        free[events_key] = next_id
      end
      local ms, seq = next_id[1], next_id[2]
      args[6] = ms .. '-' .. (seq + count - 1)
      local f = 1  -- the event's first name in EARLIER_EVENT_FIELDS (3 per event)
      for at = 5, last - 3, 3 do
        local i = (at - 2) / 3
        args[n + 1], args[n + 2] = EARLIER_EVENT_FIELDS[f] or ('event.' .. i), p[at]
        args[n + 3], args[n + 4] = EARLIER_EVENT_FIELDS[f + 2] or ('data.' .. i), p[at + 2]
        n = n + 4
        if p[at + 1] ~= p[last + 1] then
          args[n + 1], args[n + 2] = EARLIER_EVENT_FIELDS[f + 1] or ('attempt.' .. i), p[at + 1]
          n = n + 2
        end
        f = f + 3
      end
      next_id[2] = seq + count
      if type(redis.pcall(unpack(args, 1, n))) == 'table' then
        -- Refused (only if someone deleted the stream's newest entries by hand, its
        -- last id is above the newest entry's): the server's own id, above it,
        -- and the earlier events' ids named, as they no longer precede it by one.
        for i = 1, count - 1 do
          args[n + 1], args[n + 2] = 'id.' .. i, ms .. '-' .. (seq + i - 1)
          n = n + 2
        end
        args[6] = '*'
        args[6] = redis.call(unpack(args, 1, n))
        ms, seq = id_parts(args[6])
        free[events_key] = {ms, seq + 1}
      end
    end
    -- the same entry in the job's stream, trimmed exactly
    args[2], args[4], args[5] = job_events_key, '=', JOB_EVENTS_MAXLEN
    redis.pcall(unpack(args, 1, n))
  end
end

-- Batched writes. start_apply.lua runs several imports of one partition in
-- one call; the writes they share a key for (the indexes, the counters, the
-- uploads' DEL, the generation) are then gathered in BATCH and made once per
-- key at the end of the call (flush_batch) instead of once per import: ZREM
-- and ZADD with every member, one HINCRBY per counter, one DEL of every key.
-- Each import's own writes (its record, done marker, receipt, stock rows,
-- journal entry, events) are made at once, in its own order. The gathered
-- writes are bookkeeping that no step of the same call reads back (a job is
-- in a call at most once), so making them later in the same atomic call
-- changes nothing anyone can see. Run on its own (BATCH nil), every helper
-- writes at once.
-- value2: ZADD's member after its score, nil for the others.
local function batched(command, key, value, value2)
  local groups = BATCH.groups
  local group = groups[command .. ' ' .. key]
  if not group then
    group = {command, key}
    groups[command .. ' ' .. key] = group
    groups[#groups + 1] = group
  end
  group[#group + 1] = value
  if value2 ~= nil then group[#group + 1] = value2 end
end

local function zrem(key, member)
  if BATCH then batched('ZREM', key, member) else redis.call('ZREM', key, member) end
end

local function zadd(key, score, member)
  if BATCH then batched('ZADD', key, score, member) else redis.call('ZADD', key, score, member) end
end

local function del(key)
  if BATCH then batched('DEL', '', key) else redis.call('DEL', key) end
end

-- by: a number; HINCRBY (hash fields) and INCRBY (strings, field nil) sum per key and field.
local function incrby(key, field, by)
  if not BATCH then
    if field then redis.call('HINCRBY', key, field, by) else redis.call('INCRBY', key, by) end
    return
  end
  local sums = BATCH.sums[key]
  if not sums then
    sums = {}
    BATCH.sums[key] = sums
    BATCH.sums[#BATCH.sums + 1] = key
  end
  local name = field or ''
  if not sums[name] then sums[#sums + 1] = name end
  sums[name] = (sums[name] or 0) + by
end

-- The fencing token of a new attempt: INCR of the counter, or in a batch the
-- next of the tokens start_apply.lua took for the whole call (INCRBY first,
-- so no token is ever handed out twice).
local function next_token(fence_key)
  if BATCH then
    BATCH.token = BATCH.token + 1
    return tostring(BATCH.token)
  end
  return tostring(redis.call('INCR', fence_key))
end

local function flush_batch()
  for _, group in ipairs(BATCH.groups) do
    if group[1] == 'DEL' then
      redis.call('DEL', unpack(group, 3))
    else
      redis.call(group[1], group[2], unpack(group, 3))
    end
  end
  for _, key in ipairs(BATCH.sums) do
    local sums = BATCH.sums[key]
    for _, name in ipairs(sums) do
      if name == '' then redis.call('INCRBY', key, sums[name])
      elseif sums[name] ~= 0 then redis.call('HINCRBY', key, name, sums[name]) end
    end
  end
end

local function is_finished(state)
  return state == 'completed' or state == 'failed'
end

-- A finished job enters the all-owner retention index (index_key: P:jobs:completed
-- or P:jobs:failed) and P:jobs:finished:new, from where the retention pass
-- puts it in its owner's index (whose name the caller cannot know beforehand).
local function index_finished(step, index_key)
  zadd(index_key, step.now, step.id)
  zadd(step.finished_new, step.now, step.id)
end

-- Queue-wide counters in P:stats, read by GET /metrics.
local function count(stats_key, field, by)
  incrby(stats_key, field, by or 1)
end

-- [ops] Recent failures by code, for the operators' overview (adapters/redis/ops.py):
-- fields 'recent:m<5-minute bucket>:<code>' (the last hour) and 'recent:h<hour>:<code>'
-- (the last day) of P:stats, buckets of the server's clock. When the hour turns, the
-- fields past those windows leave: the hash holds at most 36 buckets of the codes seen.
local function count_recent_failure(stats_key, code, now)
  local five, hour = math.floor(now / 300000), math.floor(now / 3600000)
  incrby(stats_key, 'recent:m' .. five .. ':' .. code, 1)
  incrby(stats_key, 'recent:h' .. hour .. ':' .. code, 1)
  if redis.call('HGET', stats_key, 'recent:hour') == tostring(hour) then return end
  redis.call('HSET', stats_key, 'recent:hour', hour)
  for _, field in ipairs(redis.call('HKEYS', stats_key)) do
    local kind, bucket = string.match(field, '^recent:([mh])(%d+):')
    if kind and tonumber(bucket) <= (kind == 'h' and hour - 24 or five - 12) then redis.call('HDEL', stats_key, field) end
  end
end

local function count_failed(stats_key, error_json, now)
  local ok, decoded = pcall(cjson.decode, error_json)
  local code = (ok and type(decoded) == 'table' and decoded['code']) or 'unknown'
  count(stats_key, 'failed:' .. code)
  count_recent_failure(stats_key, code, now)
end

-- One observation of an attempt's duration (its attemptStartedAt -> now), as
-- a Prometheus histogram: the smallest bucket it fits, made cumulative at
-- scrape. Nothing when no attempt ever started. (A script that already read
-- the record's attemptStartedAt passes it as step.attempt_started.)
local function observe_duration(step)
  local started = step.attempt_started or redis.call('HGET', step.key, 'attemptStartedAt')
  if not started then return end
  local ms = step.now - tonumber(started)
  local bucket = '+Inf'
  for _, le in ipairs(DURATION_BUCKETS_MS) do
    if ms <= le then bucket = tostring(le) break end
  end
  incrby(step.stats, 'duration_le:' .. bucket, 1)
  if ms ~= 0 then incrby(step.stats, 'duration_sum_ms', ms) end
end

-- The job ends failed: record, indexes, event, counters. The one way start,
-- apply, fail and the reconciler mark a job failed.
local function mark_failed(step, batch_id, attempt, error_json, diagnostic)
  redis.call('HSET', step.key, 'state', 'failed', 'error', error_json, 'diagnostic', diagnostic,
    'finishedAt', step.now, 'updatedAt', step.now)
  zrem(step.active, step.id)
  index_finished(step, step.failed)
  emit(step.events, step.job_events, step.maxlen, 'failed', step.id, batch_id, attempt, error_json)
  count_failed(step.stats, error_json, step.now)
  observe_duration(step)
end

-- [ops] Whether an operator paused new uploads at this location, or everywhere (POST /api/ops/intake).
-- In a batch (enqueue_many.lua) it is read once per call: nothing the call writes changes it.
local function intake_paused(paused_key, location)
  local memo = BATCH and BATCH.memo
  if memo and memo['paused ' .. paused_key .. ' ' .. location] ~= nil then return memo['paused ' .. paused_key .. ' ' .. location] end
  local either = redis.call('HMGET', paused_key, '*', location)
  local paused = either[1] ~= false or either[2] ~= false
  if memo then memo['paused ' .. paused_key .. ' ' .. location] = paused end
  return paused
end

-- [door] nil when a producer of `version` may record new work, else the
-- versions the live workers accept ("1,3", ascending). Live: expiry (server
-- clock, see presence.lua) not past. One ZCOUNT when a live worker accepts
-- the version, whatever the number of workers; the rest only when none does.
-- No live worker at all: nil (queued work waits). A live id without an
-- accepts entry (removed by hand) counts as absent.
local function no_worker_accepts_now(workers_key, accepts_key, version_key, version)
  local now = server_ms()
  if redis.call('ZCOUNT', version_key, now, '+inf') > 0 then return nil end
  local live = redis.call('ZRANGEBYSCORE', workers_key, now, '+inf')
  if #live == 0 then return nil end
  local seen, any = {}, false
  for _, accepts in ipairs(redis.call('HMGET', accepts_key, unpack(live))) do
    if accepts then
      for v in string.gmatch(accepts, '%d+') do
        if v == version then return nil end
        seen[tonumber(v)] = true
        any = true
      end
    end
  end
  if not any then return nil end
  local versions = {}
  for v in pairs(seen) do versions[#versions + 1] = v end
  table.sort(versions)
  return table.concat(versions, ',')
end

-- In a batch (enqueue_many.lua) the door is checked once per call: nothing the call writes changes it.
local function no_worker_accepts(workers_key, accepts_key, version_key, version)
  local memo = BATCH and BATCH.memo
  if not memo then return no_worker_accepts_now(workers_key, accepts_key, version_key, version) end
  local name = 'door ' .. version_key
  if memo[name] == nil then memo[name] = no_worker_accepts_now(workers_key, accepts_key, version_key, version) or false end
  return memo[name] or nil
end

-- [ledger] The Bloom filter of pruned batchIds (P:ledger:pruned:filter): 2^22
-- bits (512 KiB per location that pruned a marker), 6 bit positions from the
-- SHA-1 of the batchId (about 1% false positives at 400,000 pruned batches of
-- a location, 19% at a million: a false positive costs one ledger question,
-- never a wrong answer). Set by
-- ledger_prune.lua in the same step that drops a marker, so a batch whose bits
-- are not all set never lost its marker: the door needs no ledger for it (the
-- common case, every new batch). A false positive only costs a ledger question.
local function pruned_filter_args(command, filter_key, batch_id, op)
  local h = redis.sha1hex(batch_id)
  local args = {command, filter_key}
  for i = 0, 5 do
    local n = #args
    args[n + 1], args[n + 2], args[n + 3] = op, 'u1', tonumber(string.sub(h, i * 6 + 1, i * 6 + 6), 16) % 4194304
    if op == 'SET' then args[n + 4] = 1 end
  end
  return args
end

local function maybe_pruned(filter_key, batch_id)
  -- In a batch with a memo (enqueue_many.lua), whether the filter exists is read once
  -- per call (only ledger_prune.lua writes it): without it, no batch of the call was pruned.
  local memo = BATCH and BATCH.memo
  if memo then
    local name = 'filter ' .. filter_key
    if memo[name] == nil then memo[name] = redis.call('EXISTS', filter_key) == 1 end
    if not memo[name] then return false end
  end
  for _, bit in ipairs(redis.call(unpack(pruned_filter_args('BITFIELD_RO', filter_key, batch_id, 'GET')))) do
    if bit == 0 then return false end
  end
  return true
end

local function mark_pruned(filter_key, batch_id)
  redis.call(unpack(pruned_filter_args('BITFIELD', filter_key, batch_id, 'SET')))
end
