-- KEYS[1] the agent-host hash, KEYS[2] the hosts' leases (sorted set), KEYS[3] the
-- session's load claim. ARGV[1] the session, ARGV[2] now in epoch ms, ARGV[3] the
-- claiming host, ARGV[4] the claim's lifetime in ms.
-- Returns 'live' when a host with a valid lease serves the session (the request is a
-- no-op), 'taken' when another host claimed its load, 'claimed' when this host did.

local host = redis.call('HGET', KEYS[1], ARGV[1])
if host then
  local expiry = redis.call('ZSCORE', KEYS[2], host)
  if expiry and tonumber(expiry) >= tonumber(ARGV[2]) then return 'live' end
end
if redis.call('SET', KEYS[3], ARGV[3], 'NX', 'PX', ARGV[4]) then return 'claimed' end
if redis.call('GET', KEYS[3]) == ARGV[3] then return 'claimed' end
return 'taken'
