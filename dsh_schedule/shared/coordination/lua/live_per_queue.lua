-- KEYS[1] the lease-queue hash; ARGV[1] the served-set key prefix, ARGV[2] the default
-- queue, ARGV[3..] the live hosts. Returns {queue, live agents, ...}: each host's served
-- set counted (SCARD) on the queue of one of its members, since a host installs every
-- agent it serves on its own queue. O(hosts), whatever the number of agents.

local counts, order = {}, {}
for i = 3, #ARGV do
  local served = ARGV[1] .. ARGV[i]
  local n = redis.call('SCARD', served)
  if n > 0 then
    local member = redis.call('SRANDMEMBER', served)
    local queue = redis.call('HGET', KEYS[1], member) or ARGV[2]
    if not counts[queue] then
      counts[queue] = 0
      order[#order + 1] = queue
    end
    counts[queue] = counts[queue] + n
  end
end
local out = {}
for _, queue in ipairs(order) do
  out[#out + 1] = queue
  out[#out + 1] = counts[queue]
end
return out
