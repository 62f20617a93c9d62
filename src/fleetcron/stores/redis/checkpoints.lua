-- Redis scripts of fleetcron's checkpoints (the key layout is in
-- fleetcron.stores.redis.operations and .checkpoints), one named block each, read by the
-- same loader as scripts.lua, whose `now` block they use. Each script gets one key: the
-- checkpoint's hash, with the fields `value` (the text as set, kept byte for byte),
-- `fence` and `updated` (the server's TIME in µs). Numbers come back as integers (exact
-- below 2^53, as every fence is) and a checkpoint never set as false.

-- name: checkpoint_get
-- uses: now
-- KEYS[1] checkpoint hash; no ARGV
-- returns false when the checkpoint was never set, else the checkpoint:
-- row checkpoint: {value, fence, updated_us, now_us}
local cur = redis.call('HMGET', KEYS[1], 'value', 'fence', 'updated')
-- `fence` decides existence, as in lease_get: an empty value ('') is a value
if not cur[2] then return false end
return {cur[1], tonumber(cur[2]), tonumber(cur[3]), now}

-- name: checkpoint_set
-- uses: now
-- KEYS[1] checkpoint hash; ARGV: fence, value
-- sets value, fence and updated = TIME when the checkpoint is unset or its fence is at
-- most the given one (the same run may set it again); returns 1 when set, 0 when a higher
-- fence set it (nothing changes, so a stale run cannot move it back)
local fence = tonumber(ARGV[1])
local cur = redis.call('HGET', KEYS[1], 'fence')
if cur and tonumber(cur) > fence then return 0 end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', s(fence), 'updated', s(now))
return 1
