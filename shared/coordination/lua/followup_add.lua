-- KEYS[1] the agent's followup stream; ARGV[1] the frame text, ARGV[2] the pairs (compact
-- JSON), ARGV[3] the consumer group. Returns the entry id.
-- A new stream is created with its consumer group, so the host's first read of it finds
-- the group; a host that finds none (a stream from before) creates it then.

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[3], '0', 'MKSTREAM')
end
return redis.call('XADD', KEYS[1], '*', 'text', ARGV[1], 'pairs', ARGV[2])
