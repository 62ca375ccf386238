-- KEYS[1] agent-host hash, KEYS[2] lease-queue hash, KEYS[3] the host digest hash; ARGV[1]
-- the served-set key prefix, ARGV[2..] pairs of an agent and its ``agent_digest``. Ends
-- each agent's lease: it leaves its host's set and digest and both hashes. Runs after
-- lua/host_digest.lua (digest_add).

for i = 2, #ARGV, 2 do
  local host = redis.call('HGET', KEYS[1], ARGV[i])
  if host then
    redis.call('SREM', ARGV[1] .. host, ARGV[i])
    digest_add(KEYS[3], host, -tonumber(ARGV[i + 1]))
  end
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return 1
