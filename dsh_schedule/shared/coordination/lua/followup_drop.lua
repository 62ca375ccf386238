-- KEYS[1] an agent's followup stream, KEYS[2] the followup counts, KEYS[3] their total;
-- ARGV[1] the agent. Deletes the stream.
-- The stream's count in KEYS[2] (field ARGV[1]) and their sum in KEYS[3], set to what it
-- holds now; a sum lost alone is summed again from the counts.

redis.call('DEL', KEYS[1])
return recount(KEYS[1], ARGV[1])
