-- KEYS[1] the lease-queue hash, KEYS[2] the ready stream of the queue the caller found in
-- the hash (not touched when it found none), KEYS[3] the agent-host hash. ARGV[1] the
-- agent, ARGV[2] the queue the caller found ('' for none), ARGV[3] the ready stream's length
-- limit, ARGV[4] the queue of an agent that has a host but no queue entry ('' for none): a
-- lost entry is not "no lease", and the agent is announced where its wakes are routed, the
-- deployment's default queue.
-- Returns {1} when the agent is announced on the queue its lease names (or has no lease);
-- {0, the queue the hash names now, or ''} when that is not ARGV[2]: nothing is written,
-- and the caller tries again with that queue's ready key.

local queue = redis.call('HGET', KEYS[1], ARGV[1])
if not queue then
  queue = redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 and ARGV[4] or ''
end
if queue ~= ARGV[2] then
  return {0, queue}
end
if queue ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], '*', 'agent', ARGV[1])
end
return {1}
