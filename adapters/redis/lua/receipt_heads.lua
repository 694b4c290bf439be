-- receipt_heads.lua: [ledger] the first piece of several receipts, for the
-- exporter: one call for a batch of journal entries (adapters/redis/outbox.py
-- receipt_source). A pipeline of one GETRANGE per entry cost the exporter
-- about 8 us of Python per entry in packing and parsing; this call about 1.
--
-- KEYS[1..] P:receipt:<batchId>, one per journal entry, in order
-- ARGV[1] the bytes of a piece
-- ARGV[2] the bytes to read ahead in all: once the pieces read reach it, the
--   call stops, and the rest are read when the exporter reaches them
--
-- Returns the first piece of each receipt, in order ('' for a receipt that is
-- gone), up to the first one that reached ARGV[2]: maybe fewer than KEYS.

local piece, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local heads = {}
for i, key in ipairs(KEYS) do
  if budget <= 0 then break end
  local head = redis.call('GETRANGE', key, 0, piece - 1)
  heads[i] = head
  budget = budget - #head
end
return heads
