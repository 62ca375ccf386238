-- KEYS[1] phase key, KEYS[2] idle-waiter key; ARGV[1] "<kind>:<token>".
-- Returns 0 not the owner, 1 released, 2 released and a waiter was waiting (now cleared).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('DEL', KEYS[2]) == 1 then
  return 2
end
return 1
