-- KEYS[1] the agent-host hash, KEYS[2] the lease-queue hash, KEYS[3] the agent's followup
-- stream, KEYS[4] the hosts zset; ARGV[1] the agent. Returns {the expiry of its host's
-- lease, its lease's queue, the id of its oldest followup entry}, each false when absent.

local oldest = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
local host = redis.call('HGET', KEYS[1], ARGV[1])
return {host and redis.call('ZSCORE', KEYS[4], host) or false,
        redis.call('HGET', KEYS[2], ARGV[1]), oldest and oldest[1] or false}
