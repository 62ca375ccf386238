-- KEYS[1] hosts zset, KEYS[2] the host's served set, KEYS[3] the host digest hash; ARGV[1]
-- host, ARGV[2] now ms. Forgets an expired host whose set is empty, and its digest; 1 when
-- it did (a host that renewed is kept).

local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) >= tonumber(ARGV[2]) then return 0 end
if redis.call('SCARD', KEYS[2]) > 0 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
