-- KEYS[2i-1] an agent's followup stream, KEYS[2i] the ready stream of that agent's queue.
-- ARGV[1] the stale age in ms, ARGV[2] the ready stream's length limit, ARGV[1+i] the agent.
-- Announces each agent again whose oldest entry was added at least ARGV[1] ms ago by the
-- server's clock (the first part of a stream id is the server's epoch ms). Returns the
-- positions (i) of the agents it announced.

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local announced = {}
for i = 1, #KEYS / 2 do
  local first = redis.call('XRANGE', KEYS[2 * i - 1], '-', '+', 'COUNT', 1)[1]
  if first and now_ms - tonumber(string.match(first[1], '^(%d+)')) >= tonumber(ARGV[1]) then
    redis.call('XADD', KEYS[2 * i], 'MAXLEN', ARGV[2], '*', 'agent', ARGV[2 + i])
    announced[#announced + 1] = i
  end
end
return announced
