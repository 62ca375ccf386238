-- KEYS[1] the live zset, KEYS[2] the lease-queue hash, KEYS[3] the agent's followup stream;
-- ARGV[1] the agent. Returns {its lease's score, its lease's queue, the id of its oldest
-- followup entry}, each false when absent.

local oldest = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
return {redis.call('ZSCORE', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1]),
        oldest and oldest[1] or false}
