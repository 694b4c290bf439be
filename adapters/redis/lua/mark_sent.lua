-- mark_sent.lua: jobs' messages are in the broker (sent after enqueue.lua
-- recorded the jobs without them: RabbitMQ, another location's job on a
-- Redis Cluster, or the imports of a bulk request sent as group messages):
-- each leaves the unsent index and gets the deadline of a sent message,
-- unless an attempt already started and set one (NX).
--
-- KEYS[1] P:jobs:unsent   KEYS[2] P:jobs:deadline
-- ARGV[1] the deadline ms (the producer's clock: sentAt + grace)
-- ARGV[2..] the jobIds (of one partition)
--
-- One script rather than a MULTI/EXEC: on a Redis Cluster whose slot is
-- moving, a script's ASK or TRYAGAIN is followed (or retried) by the client,
-- a transaction's is not.

local deadline = ARGV[1]
local marks = {}
for i = 2, #ARGV do
  marks[#marks + 1] = deadline
  marks[#marks + 1] = ARGV[i]
end
redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
redis.call('ZADD', KEYS[2], 'NX', unpack(marks))
return #ARGV - 1
