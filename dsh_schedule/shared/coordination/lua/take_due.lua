-- KEYS[1] the schedule (sorted set); ARGV[1] now in epoch seconds (a decimal string, to the
-- millisecond), ARGV[2] the most entries to take, ARGV[3] rq's job key prefix, ARGV[4] the
-- wake id prefix. Returns {earliest score left or false, entries}, entries oldest first:
-- {id, flat job hash, score} for a wake, taken out of the schedule with its job hash
-- deleted in this same step (so only one mover pass ever hands it on; the score is its
-- target); {id} for any other due job,
-- left in the schedule for rq-scheduler's own enqueue. The job hashes' keys are built from
-- ARGV[3], not declared: one Redis node, not a cluster.

local scored = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES',
                         'LIMIT', 0, tonumber(ARGV[2]))
local entries = {}
for i = 1, #scored / 2 do
  local id, score = scored[2 * i - 1], scored[2 * i]
  if string.sub(id, 1, #ARGV[4]) == ARGV[4] then
    local job_key = ARGV[3] .. id
    local fields = redis.call('HGETALL', job_key)
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', job_key)
    entries[i] = {id, fields, score}
  else
    entries[i] = {id}
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {first[2] or false, entries}
