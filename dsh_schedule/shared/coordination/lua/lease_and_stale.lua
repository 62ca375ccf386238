-- KEYS[1] the agent-host hash, KEYS[2] the lease-queue hash, KEYS[3] the agent's followup
-- stream, KEYS[4] the hosts zset; ARGV[1] the agent, ARGV[2] the stale age in ms. Returns
-- {the expiry of its host's lease, its lease's queue, 1 when the oldest entry of its
-- followup stream was added at least ARGV[2] ms ago by the server's clock (the first part
-- of a stream id is the server's epoch ms), else 0}, the first two false when absent.

local host = redis.call('HGET', KEYS[1], ARGV[1])
local first = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
local stale = 0
if first then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  if now_ms - tonumber(string.match(first[1], '^(%d+)')) >= tonumber(ARGV[2]) then
    stale = 1
  end
end
return {host and redis.call('ZSCORE', KEYS[4], host) or false,
        redis.call('HGET', KEYS[2], ARGV[1]), stale}
