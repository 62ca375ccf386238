-- KEYS[1] an agent's followup stream, KEYS[2] the followup counts, KEYS[3] their total;
-- ARGV[1] the consumer group, ARGV[2] an entry id, ARGV[3] the agent.
-- Acknowledges and deletes the entry.
-- The stream's count in KEYS[2] (field ARGV[3]) and their sum in KEYS[3], set to what it
-- holds now; a sum lost alone is summed again from the counts.

redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
local deleted = redis.call('XDEL', KEYS[1], ARGV[2])
recount(KEYS[1], ARGV[3])
return deleted
