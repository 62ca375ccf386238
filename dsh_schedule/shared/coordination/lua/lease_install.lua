-- KEYS[1] hosts zset, KEYS[2] agent-host hash, KEYS[3] lease-queue hash, KEYS[4] this
-- host's served set, KEYS[5] the host digest hash; ARGV[1] host, ARGV[2] expiry ms, ARGV[3]
-- now ms, ARGV[4] queue, ARGV[5] the served-set key prefix, ARGV[6..] pairs of an agent and
-- its ``agent_digest``. Renews the host's lease, serves each agent from this host (moving
-- it from the host that served it), and returns the agents that were not live here
-- before: no host, an expired one, another host, or no queue entry (a lost one is written
-- again, and the agent woken). Runs after lua/host_digest.lua (digest_add).

local host, now, queue, served = ARGV[1], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local mine = redis.call('ZSCORE', KEYS[1], host)
local mine_live = mine and tonumber(mine) >= now
redis.call('ZADD', KEYS[1], ARGV[2], host)
local new = {}
for i = 6, #ARGV, 2 do
  local agent, share = ARGV[i], tonumber(ARGV[i + 1])
  local old = redis.call('HGET', KEYS[2], agent)
  local is_new = false
  if old ~= host then
    if old then
      redis.call('SREM', served .. old, agent)
      digest_add(KEYS[5], old, -share)
    end
    redis.call('HSET', KEYS[2], agent, host)
    digest_add(KEYS[5], host, share)
    is_new = true
  elseif not mine_live or redis.call('SADD', KEYS[4], agent) == 1 then
    is_new = true
  end
  redis.call('SADD', KEYS[4], agent)
  local had = redis.call('HGET', KEYS[3], agent)
  if had ~= queue then
    redis.call('HSET', KEYS[3], agent, queue)
    if not had then is_new = true end
  end
  if is_new then new[#new + 1] = agent end
end
return new
