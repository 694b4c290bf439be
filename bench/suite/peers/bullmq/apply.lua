-- applyShipment: apply one validated shipment to stock exactly once, in one atomic step.
-- KEYS[1] <prefix>:done:<batchId>   KEYS[2] <prefix>:stock   KEYS[3] <prefix>:generation
-- ARGV[1] batchId  ARGV[2] content sha256  ARGV[3] rows  ARGV[4] now (ms)
-- ARGV[5], ARGV[6], ...  sku, quantity pairs (validated by shipment.js)
-- Returns {'applied', resultJson} | {'replayed', resultJson} | {'conflict', ''}
local done = redis.call('HMGET', KEYS[1], 'sha256', 'result')
if done[1] then
  if done[1] ~= ARGV[2] then return {'conflict', ''} end
  return {'replayed', done[2]}
end
for i = 5, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
end
local generation = redis.call('INCR', KEYS[3])
local result = cjson.encode({imported = tonumber(ARGV[3]), batchId = ARGV[1]})
redis.call('HSET', KEYS[1], 'sha256', ARGV[2], 'result', result, 'generation', generation, 'at', ARGV[4])
return {'applied', result}
