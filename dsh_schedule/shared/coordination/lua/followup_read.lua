-- KEYS[1] an agent's followup stream; ARGV[1] the consumer group, ARGV[2] the consumer,
-- ARGV[3] the most entries to read. This consumer's unacknowledged entries (an entry
-- deleted since comes without fields), else its new ones: {1, {{id, {field, value, ...}},
-- ...}, drained}, drained 1 when they were new ones and fewer than ARGV[3] (the read took
-- every entry the stream held); {0, the error, 0} when the stream or its group is missing.

local function read(start)
  local reply = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                            'STREAMS', KEYS[1], start)
  if type(reply) == 'table' and reply['err'] then
    return nil, reply['err']
  end
  if not reply or not reply[1] then
    return {}
  end
  if type(reply[1]) == 'table' then
    reply = reply[1]  -- {{stream, entries}}; the embedded server leaves out the outer list
  end
  return reply[2] or {}
end
local entries, err = read('0')
if err then
  return {0, err, 0}
end
for _, entry in ipairs(entries) do
  if entry[2] then
    return {1, entries, 0}
  end
end
entries, err = read('>')
if err then
  return {0, err, 0}
end
if #entries < tonumber(ARGV[3]) then
  return {1, entries, 1}
end
return {1, entries, 0}
