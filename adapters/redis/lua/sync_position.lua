-- sync_position.lua: how far this Redis has come at one location, against the
-- ledger's last shipment there (adapters/redis/sync.py, domain/ledger.py is_behind):
-- the journal's last generated id (kept by XINFO when the entries are trimmed;
-- '' without a journal), whether Redis has a trace of the ledger's last batch
-- (its done marker, or its bits in the filter of pruned markers: common.lua),
-- and how many applies this location counted (P:generation).
--
-- KEYS: P:journal  P:done:<the ledger's last batchId>  P:ledger:pruned:filter  P:generation
-- ARGV: that batchId ('' when the ledger holds none here)
local last = ''
if redis.call('EXISTS', KEYS[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
end
local known = 0
if ARGV[1] ~= '' and (redis.call('EXISTS', KEYS[2]) == 1 or maybe_pruned(KEYS[3], ARGV[1])) then known = 1 end
return {last, known, tonumber(redis.call('GET', KEYS[4]) or '0')}
