-- KEYS[1] hosts zset, KEYS[2] this host's served set, KEYS[3] the host digest hash;
-- ARGV[1] host, ARGV[2] expiry ms, ARGV[3] now ms. Returns {1 when the host's lease was
-- valid, the size of its served set, its digest}.

local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local valid = 0
if old and tonumber(old) >= tonumber(ARGV[3]) then valid = 1 end
return {valid, redis.call('SCARD', KEYS[2]),
        tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')}
