-- KEYS[1] the workers zset, KEYS[2] the holds hash; ARGV[1] the name, ARGV[2] the score it
-- was seen with, ARGV[3] the new score ('' removes it and its holds). Changes nothing when
-- the score moved meanwhile (the worker beat again, or another scheduler took it): 1 done.

local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
