-- KEYS[1] a lock key; ARGV[1] the batch's token, ARGV[2] the TTL in ms. The same
-- ``SET NX PX`` a single lock takes; 1 when taken, 0 when the lock is busy.

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
