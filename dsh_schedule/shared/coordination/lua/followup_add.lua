-- KEYS[1] the agent's followup stream, KEYS[2] the followup counts, KEYS[3] their total;
-- ARGV[1] the frame text, ARGV[2] the pairs (compact JSON), ARGV[3] the consumer group,
-- ARGV[4] the agent. Returns the entry id.
-- A new stream is created with its consumer group, so the host's first read of it finds
-- the group; a host that finds none (a stream from before) creates it then.
-- The stream's count in KEYS[2] (field ARGV[4]) and their sum in KEYS[3], set to what it
-- holds now; a sum lost alone is summed again from the counts.

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[3], '0', 'MKSTREAM')
end
local id = redis.call('XADD', KEYS[1], '*', 'text', ARGV[1], 'pairs', ARGV[2])
recount(KEYS[1], ARGV[4])
return id
