-- mark_sent.lua: a job's message is in the broker (sent after enqueue.lua
-- recorded the job without it: RabbitMQ, or another location's job on a
-- Redis Cluster): it leaves the unsent index and gets the deadline of a sent
-- message, unless an attempt already started and set one (NX).
--
-- KEYS[1] P:jobs:unsent   KEYS[2] P:jobs:deadline
-- ARGV[1] jobId   ARGV[2] the deadline ms (the producer's clock: sentAt + grace)
--
-- One script rather than a MULTI/EXEC: on a Redis Cluster whose slot is
-- moving, a script's ASK or TRYAGAIN is followed (or retried) by the client,
-- a transaction's is not.

redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
return 1
