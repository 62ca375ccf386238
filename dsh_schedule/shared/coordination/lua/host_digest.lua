-- digest_add(hash, host, share): adds share to the host's digest in hash, modulo 2^48 (a
-- double holds these sums exactly); a digest of 0 leaves the hash. Not a script of its
-- own: leases.py puts it before the lease scripts that move an agent between hosts
-- (lease_install, lease_drop). The host digest: per host, the sum of the
-- ``agent_digest`` of every agent whose agent-host entry names it, changed in the same
-- script as the entry, so a write Redis lost takes its digest change with it.
local function digest_add(hash, host, share)
  local d = (tonumber(redis.call('HGET', hash, host) or '0') + share) % 281474976710656
  if d == 0 then redis.call('HDEL', hash, host)
  else redis.call('HSET', hash, host, string.format('%.0f', d)) end
end
