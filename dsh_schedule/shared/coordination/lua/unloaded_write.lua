-- KEYS[1] the queue's unloaded timers (sorted set), KEYS[2] its load attempts (hash),
-- KEYS[3] the set of queues with timers, KEYS[4] the agent-host hash, KEYS[5] the hosts'
-- leases (sorted set), KEYS[6] the mover's nudge list. ARGV[1] the queue, ARGV[2] now in
-- epoch ms, ARGV[3] 'min' (a rebuild from the store's index: a timer is only ever moved
-- earlier, so a stale index makes it early, never late, and an overdue session whose
-- request waits out a backoff is asked for again at the next pass) or 'set' (a
-- transaction's own fold, its lock held: the timer is its next moment, '' none),
-- ARGV[4..] pairs of a session and its moment in epoch ms.
-- Sessions a live host serves are left alone: their wake is their timer. Returns how many
-- timers it wrote.

local now, mode, written = tonumber(ARGV[2]), ARGV[3], 0
for i = 4, #ARGV, 2 do
  local session, due = ARGV[i], ARGV[i + 1]
  local host = redis.call('HGET', KEYS[4], session)
  local live = false
  if host then
    local expiry = redis.call('ZSCORE', KEYS[5], host)
    live = expiry and tonumber(expiry) >= now
  end
  if not live then
    if due == '' then
      redis.call('ZREM', KEYS[1], session)
      redis.call('HDEL', KEYS[2], session)
    else
      local had = redis.call('ZSCORE', KEYS[1], session)
      if mode == 'set' or not had or tonumber(had) > tonumber(due) then
        redis.call('ZADD', KEYS[1], due, session)
        if mode == 'set' then redis.call('HDEL', KEYS[2], session) end
        written = written + 1
      end
    end
  end
end
if written > 0 then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('LPUSH', KEYS[6], '1')
  redis.call('LTRIM', KEYS[6], 0, 0)
end
return written
