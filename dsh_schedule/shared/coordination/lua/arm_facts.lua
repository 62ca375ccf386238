-- KEYS[1] the agent's current-wake pointer, KEYS[2] rq-scheduler's schedule, KEYS[3] the
-- job key a wake for the new target would take; ARGV[1] 1 when there is a new target.
-- Returns {the current wake id, its score, whether KEYS[3] exists (0 without a target)};
-- the first two false when absent (a current wake that is not scheduled has no score).

local current = redis.call('GET', KEYS[1])
local score = false
if current then
  score = redis.call('ZSCORE', KEYS[2], current)
end
local taken = 0
if ARGV[1] == '1' then
  taken = redis.call('EXISTS', KEYS[3])
end
return {current, score, taken}
