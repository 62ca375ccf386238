-- KEYS[1] an agent's followup stream, KEYS[2] the followup counts, KEYS[3] their total;
-- ARGV[1] the consumer group, ARGV[2] an entry id, ARGV[3] the agent.
-- Acknowledges and deletes the entry.
-- The stream's count in KEYS[2] (field ARGV[3]) and their sum in KEYS[3], set to what it
-- holds now; a sum lost alone is summed again from the counts.
local function recount(stream, agent)
  local n = redis.call('XLEN', stream)
  local old = tonumber(redis.call('HGET', KEYS[2], agent) or '0')
  if redis.call('EXISTS', KEYS[3]) == 0 then
    local sum = 0
    for _, v in ipairs(redis.call('HVALS', KEYS[2])) do sum = sum + tonumber(v) end
    redis.call('SET', KEYS[3], sum)
  end
  if n ~= old then
    if n == 0 then redis.call('HDEL', KEYS[2], agent) else redis.call('HSET', KEYS[2], agent, n) end
    redis.call('INCRBY', KEYS[3], n - old)
  end
  return n
end

redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
local deleted = redis.call('XDEL', KEYS[1], ARGV[2])
recount(KEYS[1], ARGV[3])
return deleted
