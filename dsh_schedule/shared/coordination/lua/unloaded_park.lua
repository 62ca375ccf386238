-- KEYS[1] the queue's unloaded timers (sorted set), KEYS[2] its load attempts (hash),
-- KEYS[3] the set of queues with timers, KEYS[4] the mover's nudge list. ARGV[1] the
-- queue, ARGV[2..] pairs of a session and its timer in epoch ms ('' for none).
-- Writes each session's timer (or removes it), forgets its outstanding requests, and
-- nudges a scheduler that sleeps until a later moment. Returns how many timers it wrote.

redis.call('SADD', KEYS[3], ARGV[1])
local written = 0
for i = 2, #ARGV, 2 do
  local session, due = ARGV[i], ARGV[i + 1]
  if due == '' then
    redis.call('ZREM', KEYS[1], session)
  else
    redis.call('ZADD', KEYS[1], due, session)
    written = written + 1
  end
  redis.call('HDEL', KEYS[2], session)
end
if written > 0 then
  redis.call('LPUSH', KEYS[4], '1')
  redis.call('LTRIM', KEYS[4], 0, 0)
end
return written
