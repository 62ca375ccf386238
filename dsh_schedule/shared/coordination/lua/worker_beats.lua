-- KEYS[1] the beats zset. Returns {Redis's clock in ms, {name, score, ...}}: every worker
-- that beats, and by when it beats again.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}
