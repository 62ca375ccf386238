-- KEYS[1] an agent's followup stream; ARGV[1] the consumer group, ARGV[2] an entry id.
-- Acknowledges and deletes the entry.

redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return redis.call('XDEL', KEYS[1], ARGV[2])
