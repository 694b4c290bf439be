-- read_receipt.lua: a batch's receipt, for the owner of its done marker only.
--
-- KEYS[1] P:done:<batchId>   KEYS[2] P:receipt:<batchId>
-- ARGV[1] owner   ARGV[2] how many bytes of the receipt to return (>= 1)
--
-- As read_owned.lua: only the owner field is read before deciding, so a
-- missing batch and another owner's take the same path and return the same
-- empty reply. The done marker and its receipt are written in one apply
-- step and never rewritten, so the rest can be read later, in ranges.
--
-- Returns {} unless the done marker's owner is ARGV[1]; else
-- {the done marker as HGETALL returns it, the receipt's length in bytes
--  (0: applied before receipts were recorded), its first ARGV[2] bytes}.

if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {} end
return {
  redis.call('HGETALL', KEYS[1]),
  redis.call('STRLEN', KEYS[2]),
  redis.call('GETRANGE', KEYS[2], 0, tonumber(ARGV[2]) - 1),
}
