-- ledger_prune.lua: [ledger] drop done markers past the idempotency horizon
-- whose batch has no job record left; the ledger answers for them from then
-- on (apply.lua, "The door"). Only markers that ledger_trim.lua indexed are
-- candidates: their batch is committed in the ledger.
--
-- KEYS[1] P:ledger:markers   KEYS[2] P:ledger:pruned   KEYS[3] P:ledger:pruned:filter
-- KEYS[4..] per batch: P:done:<batchId>, P:job:<jobId of that batch here>
-- ARGV[1] the horizon's cutoff ms (markers applied at or before it go)
-- ARGV[2] ms to wait before looking again at a marker whose job record is still there
-- ARGV[3..] the batchIds, in the order of their KEYS
--
-- A batch with a job record is never pruned: while its record exists, the
-- door's answer for that job (marker or ledger) cannot change under it.
-- P:ledger:pruned counts the calls that pruned something: an apply that asked
-- the ledger before such a call asks again (apply.lua).
--
-- Returns the number of markers dropped.

local cutoff, later = tonumber(ARGV[1]), tonumber(ARGV[2])
local dropped = 0
for i = 3, #ARGV do
  local batch_id = ARGV[i]
  local done_key, job_key = KEYS[4 + 2 * (i - 3)], KEYS[5 + 2 * (i - 3)]
  local score = redis.call('ZSCORE', KEYS[1], batch_id)
  if score and tonumber(score) <= cutoff then
    if redis.call('EXISTS', job_key) == 1 then
      redis.call('ZADD', KEYS[1], tonumber(score) + later, batch_id)
    else
      redis.call('DEL', done_key)
      mark_pruned(KEYS[3], batch_id)  -- the door asks the ledger about this batch from now on
      redis.call('ZREM', KEYS[1], batch_id)
      dropped = dropped + 1
    end
  end
end
if dropped > 0 then redis.call('INCR', KEYS[2]) end
return dropped
