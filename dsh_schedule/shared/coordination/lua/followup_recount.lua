-- KEYS[1] an agent's followup stream, KEYS[2] the followup counts, KEYS[3] their total;
-- ARGV[1] the agent. Counts the stream again (a count lost, or a stream written by an
-- older version); returns its length.
-- The stream's count in KEYS[2] (field ARGV[1]) and their sum in KEYS[3], set to what it
-- holds now; a sum lost alone is summed again from the counts.

return recount(KEYS[1], ARGV[1])
