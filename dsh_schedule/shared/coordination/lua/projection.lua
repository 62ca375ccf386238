-- KEYS[1] an agent's current-wake pointer, KEYS[2] its followup stream, KEYS[3] the
-- schedule; ARGV[1] the prefix of rq's job keys. Returns {the current wake, the id of the
-- oldest followup entry, 1 when the wake is in the schedule or its job hash exists}, the
-- first two false when absent.

local wake = redis.call('GET', KEYS[1])
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
local held = 0
if wake and (redis.call('ZSCORE', KEYS[3], wake)
             or redis.call('EXISTS', ARGV[1] .. wake) == 1) then
  held = 1
end
return {wake, first and first[1] or false, held}
