-- The wrapper that runs a per-item script body once per item of a batch, in one call.
-- ARGV[1] keys per item, ARGV[2] arguments per item, ARGV[3] the number of items; item i's
-- keys and arguments follow in order. Each item's reply is the body's (nil becomes false,
-- Redis's nil), in the order of the items. The item's script (a script written for one
-- item, its keys in KEYS and arguments in ARGV) takes the place of the comment in `one`.

local nk, na, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function one(KEYS, ARGV)
  -- (the item's script)
end
local replies = {}
for i = 0, n - 1 do
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[i * nk + j] end
  for j = 1, na do args[j] = ARGV[3 + i * na + j] end
  local reply = one(keys, args)
  if reply == nil then reply = false end
  replies[i + 1] = reply
end
return replies
