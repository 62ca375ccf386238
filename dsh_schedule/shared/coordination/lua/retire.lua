-- Nothing to arm, for one agent (``queue_script_batch`` runs it for many in one call).
-- KEYS[1] the schedule, KEYS[2] the current wake's job hash (the pointer when none), KEYS[3]
-- the agent's current-wake pointer, KEYS[4] its wake counter, KEYS[5] its lock; ARGV[1] the
-- current wake id ('' for none), deleted as ``_ARM_WRITE`` deletes a superseded one, ARGV[2]
-- the lock's token ('' for no check): an agent whose lock no longer holds it keeps its
-- wake (0), as ``_ARM_WRITE`` leaves it.

if ARGV[2] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[2] then
  return 0
end
if ARGV[1] ~= '' and redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('DEL', KEYS[2])
end
redis.call('DEL', KEYS[3], KEYS[4])
return 1
