-- KEYS[1] the queue's unloaded timers (sorted set), KEYS[2] its load attempts (hash),
-- KEYS[3] its load request stream, KEYS[4] the hosts' leases (sorted set), KEYS[5] the
-- agent-host hash. ARGV[1] now in epoch ms, ARGV[2] the most timers to take, ARGV[3] the
-- first backoff in ms, ARGV[4] the longest backoff in ms, ARGV[5] the lock key prefix,
-- ARGV[6] the request stream's length limit, ARGV[7] how long a live session whose lock
-- is held keeps its timer, in ms.
-- For each timer due at now or before: a session a live host serves has its timer removed
-- (its wake is its timer), unless its lock is held (it may be being disposed of: the timer
-- is looked at again shortly); any other session is announced once on the request stream
-- and its timer moved on by the backoff, doubled at each attempt. Returns {the earliest
-- timer left or false, {session, attempt, backoff ms} for each announced}. The lock keys
-- are built from ARGV[5], not declared: one Redis node, not a cluster.

local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local announced = {}
for _, session in ipairs(due) do
  local host = redis.call('HGET', KEYS[5], session)
  local live = false
  if host then
    local expiry = redis.call('ZSCORE', KEYS[4], host)
    live = expiry and tonumber(expiry) >= now
  end
  if live and redis.call('EXISTS', ARGV[5] .. session) == 1 then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[7]), session)
  elseif live then
    redis.call('ZREM', KEYS[1], session)
    redis.call('HDEL', KEYS[2], session)
  else
    local attempt = redis.call('HINCRBY', KEYS[2], session, 1)
    local backoff = math.min(tonumber(ARGV[3]) * 2 ^ math.min(attempt - 1, 40),
                             tonumber(ARGV[4]))
    redis.call('ZADD', KEYS[1], string.format('%.0f', now + backoff), session)
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'session', session,
               'attempt', attempt)
    announced[#announced + 1] = {session, attempt, string.format('%.0f', backoff)}
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {first[2] or false, announced}
