-- KEYS[1] the workers zset, KEYS[2] the holds hash; ARGV[1] the most workers to return.
-- Returns {Redis's clock in ms, {name, score, held or false}...} for every worker whose
-- beat is overdue.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
                         tonumber(ARGV[1]))
local out = {now}
for i = 1, #found, 2 do
  out[#out + 1] = {found[i], found[i + 1], redis.call('HGET', KEYS[2], found[i]) or false}
end
return out
