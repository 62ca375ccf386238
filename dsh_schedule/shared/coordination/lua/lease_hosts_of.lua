-- KEYS[1] hosts zset, KEYS[2] agent-host hash; ARGV[1] now ms, ARGV[2..] agents. Returns,
-- per agent, its host when that host's lease is valid, else false.

local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local host = redis.call('HGET', KEYS[2], ARGV[i])
  if host then
    local expiry = redis.call('ZSCORE', KEYS[1], host)
    if not expiry or tonumber(expiry) < now then host = false end
  end
  out[i - 1] = host or false
end
return out
