-- KEYS[1] the workers zset, KEYS[2] the beats zset; ARGV[1] ms until the next beat is due,
-- ARGV[2] the worker's name. The beat's score is Redis's clock plus that, so no two
-- machines' clocks are compared. Beats a day stale (workers killed long ago) are pruned.
-- Returns Redis's clock in ms.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 86400000)
return now
