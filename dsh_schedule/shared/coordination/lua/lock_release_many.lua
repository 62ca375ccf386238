-- KEYS the lock keys of a batch; ARGV[1] the batch's token. Deletes each key that still
-- holds the token (one a lock of the same key taken over after expiry is left alone).

local released = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
return released
