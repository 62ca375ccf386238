-- KEYS[1] phase key; ARGV[1] "<kind>:<token>", ARGV[2] ttl ms. Returns 1 renewed, 0 lost.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
