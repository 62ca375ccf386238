-- KEYS[1] the generation marker; ARGV[1] a fresh token. Returns the marker, written first
-- when it was missing.

local token = redis.call('GET', KEYS[1])
if token then return token end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
