-- KEYS[1] phase key, KEYS[2] idle-waiter key; ARGV[1] "<kind>:<token>", ARGV[2] ttl ms,
-- ARGV[3] "1" to register an idle waiter when the phase is taken.
-- Returns 1 claimed, 0 taken (waiter registered when asked).

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
return 0
