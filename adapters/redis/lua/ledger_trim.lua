-- ledger_trim.lua: [ledger] drop from Redis the journal entries and receipts
-- that the ledger has committed, once past the hot window; their done
-- markers stay, indexed for pruning past the idempotency horizon
-- (ledger_prune.lua).
--
-- KEYS[1] P:journal   KEYS[2] P:ledger:markers   KEYS[3..] P:receipt:<batchId>, one per entry
-- ARGV[1] the ledger's committed cursor 'ms-seq' (adapters/redis/outbox.py read it
--         from PostgreSQL after the commit): no entry after it is touched
-- ARGV[2..] per entry: its stream id, batchId, appliedAt ms
--
-- Returns the number of entries dropped.

local function after(a, b)  -- stream ids as two integers, never as strings
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams > bms or (ams == bms and aseq > bseq)
end

local dropped = 0
for i = 2, #ARGV, 3 do
  local id, batch_id, applied_at = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if not after(id, ARGV[1]) then
    local receipt_key = KEYS[3 + (i - 2) / 3]
    if redis.call('XDEL', KEYS[1], id) == 1 then
      redis.call('DEL', receipt_key)
      redis.call('ZADD', KEYS[2], applied_at, batch_id)
      dropped = dropped + 1
    end
  end
end
return dropped
