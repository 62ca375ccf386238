-- KEYS[1] an agent's followup stream. Its length.

return redis.call('XLEN', KEYS[1])
