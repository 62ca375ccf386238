-- KEYS[2] the followup counts, KEYS[3] their total (the followup scripts' own KEYS).
-- recount(stream, agent): the stream's count in KEYS[2] (field agent) and their sum in
-- KEYS[3], set to what the stream holds now; a sum lost alone is summed again from the
-- counts. Not a script of its own: followups.py puts it before the followup scripts
-- that write a stream (add, done, drop, recount).
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
