-- read_owned.lua: a job record or a done marker, for its owner only.
--
-- KEYS[1] P:job:<jobId> or P:done:<batchId>
-- ARGV[1] owner
--
-- Only the owner field is read before deciding: a missing key and another
-- owner's key take the same path and return the same empty reply, so
-- neither the answer nor its timing tells them apart.
--
-- Returns the hash as HGETALL does, or {} unless its owner is ARGV[1].

if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return {} end
return redis.call('HGETALL', KEYS[1])
