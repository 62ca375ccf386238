-- The writes of arming, for many agents in one call (``WakeProjection._write_arms``): for
-- each, a scheduled rq job (the slimmed hash ``WakeProjection._scheduled`` builds from rq's
-- own ``Job.to_dict``), its score in the schedule, the current-wake pointer, and the
-- superseded wake's removal. Only a superseded wake still waiting in the schedule is ours
-- to delete; one already handed on (its job hash deleted by the mover) is left alone: its
-- batch runs, finds nothing due (or re-arms) and ends. An agent whose lock no longer holds
-- the arming thread's token (it expired while the holder was paused or slow, and another
-- writer may have armed from a longer log since) gets no write. KEYS[1] the schedule; then
-- per agent the new job hash, the current-wake pointer, the superseded job hash (the new
-- one when none), the agent's lock. ARGV[1] S, then S field/value pairs every job shares;
-- then V, the V field names whose values differ from job to job; then per agent its wake
-- id, score, superseded wake id ('' for none), lock token ('' for no check) and V values.
-- Returns the positions (from 1) of the agents not armed for their lock.

local s = tonumber(ARGV[1])
local v = tonumber(ARGV[2 + 2 * s])
local base = 2 + 2 * s + v
local per = 4 + v
local n = (#ARGV - base) / per
-- The shared pairs and the own fields' names once; each wake fills in its own values.
local fields = {}
for j = 2, 1 + 2 * s do fields[#fields + 1] = ARGV[j] end
for j = 1, v do fields[2 * s + 2 * j - 1] = ARGV[2 + 2 * s + j] end
local lost = {}
for i = 0, n - 1 do
  local a = base + i * per
  local id, previous, token = ARGV[a + 1], ARGV[a + 3], ARGV[a + 4]
  if token ~= '' and redis.call('GET', KEYS[5 + 4 * i]) ~= token then
    lost[#lost + 1] = i + 1
  else
    for j = 1, v do fields[2 * s + 2 * j] = ARGV[a + 4 + j] end
    redis.call('HSET', KEYS[2 + 4 * i], unpack(fields))
    redis.call('ZADD', KEYS[1], ARGV[a + 2], id)
    redis.call('SET', KEYS[3 + 4 * i], id)
    if previous ~= '' and previous ~= id and redis.call('ZREM', KEYS[1], previous) == 1 then
      redis.call('DEL', KEYS[4 + 4 * i])
    end
  end
end
return lost
