-- Redis scripts of the fleetcron work queue (the key layout is in
-- fleetcron.stores.redis.queue), one named block each, read by the same loader as
-- scripts.lua, whose `now` block they use. Every script is one operation on one queue and
-- gets the queue's seven keys, in this order, all under the queue's hash tag:
--   KEYS[1] ids, KEYS[2] seq, KEYS[3] ready, KEYS[4] claimed, KEYS[5] done, KEYS[6] dead,
--   KEYS[7] dedupe.
-- An item's hash is KEYS[1] with its final `ids` replaced by `item:<id>` (same hash tag).
-- Rows come back as their `-- row` declarations say (see scripts.lua), numbers as
-- integers (exact below 2^53) and NULL as false.

-- name: queue
local IDS, SEQ, READY, CLAIMED, DONE, DEAD, DEDUPE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local SET_OF = {ready = READY, claimed = CLAIMED, done = DONE, dead = DEAD}
local ITEM_BASE = string.sub(IDS, 1, -4) .. 'item:'
local ITEM_FIELDS = {'dedupe', 'payload', 'state', 'attempts', 'max_attempts', 'fence',
                     'holder', 'available', 'created', 'finished', 'error'}
-- an item's member in the sorted sets: its id zero-padded, because members of equal score
-- come out in byte order, and so lowest id first
local function member(id) return string.format('%016d', id) end
local function item_key(id) return ITEM_BASE .. s(id) end
-- an optional argument: '' is NULL, else '=' .. value
local function opt(v)
  if v == '' then return nil end
  return string.sub(v, 2)
end
-- an item row, false when absent:
-- row item: {id, dedupe_key, payload, state, attempts, max_attempts, fence, holder,
--            available_us, created_us, finished_us, error, now_us}
local function item_row(id)
  local r = redis.call('HMGET', item_key(id), unpack(ITEM_FIELDS))
  if not r[3] then return false end
  local finished = false
  if r[10] then finished = tonumber(r[10]) end
  return {id, r[1], r[2], r[3], tonumber(r[4]), tonumber(r[5]), tonumber(r[6]), r[7],
          tonumber(r[8]), tonumber(r[9]), finished, r[11], now}
end
-- whether item `id` is held under exactly `fence` (its decimal text, compared as text so
-- that no fence is rounded): claimed, with that fence, its claim not expired at TIME; and
-- its attempts and max_attempts
local function held(id, fence)
  local r = redis.call('HMGET', item_key(id), 'state', 'fence', 'available', 'attempts',
                       'max_attempts')
  return r[1] == 'claimed' and r[2] == fence and tonumber(r[3]) > now, r[4], r[5]
end
-- move item `id` to the sorted set `to` with `score`, out of `from`
local function move(id, from, to, score)
  redis.call('ZREM', from, member(id))
  redis.call('ZADD', to, s(score), member(id))
end
-- the first `limit` entries {score, member, set} of the sorted sets `sets` with a score up
-- to `max`, by score then member: `limit` from each set is enough, so the cost follows
-- `limit`, not the size of the queue
local function earliest(sets, max, limit)
  local found = {}
  for _, set in ipairs(sets) do
    local flat = redis.call('ZRANGEBYSCORE', set, '-inf', s(max), 'WITHSCORES',
                            'LIMIT', 0, limit)
    for i = 1, #flat, 2 do found[#found + 1] = {tonumber(flat[i + 1]), flat[i], set} end
  end
  table.sort(found, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  for i = #found, limit + 1, -1 do found[i] = nil end
  return found
end
-- delete item `id` if it is finished (done or dead) at or before `cutoff`, freeing its
-- dedupe key; 1 when deleted, else 0 (it was requeued or is gone)
local function drop(id, cutoff)
  local key = item_key(id)
  local r = redis.call('HMGET', key, 'state', 'finished', 'dedupe')
  if (r[1] ~= 'done' and r[1] ~= 'dead') or not r[2] or tonumber(r[2]) > cutoff then
    return 0
  end
  redis.call('DEL', key)
  redis.call('ZREM', SET_OF[r[1]], member(id))
  redis.call('ZREM', IDS, member(id))
  if r[3] and redis.call('HGET', DEDUPE, r[3]) == s(id) then
    redis.call('HDEL', DEDUPE, r[3])
  end
  return 1
end

-- name: queue_put
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: 4 per item: payload, dedupe_key? ('' none, else '=' ..
-- key), delay_us, max_attempts
-- adds each item as ready at TIME + delay_us; returns one answer per item, in order: its
-- new id (from the counter, so increasing), or false when an item of the queue already
-- has its dedupe key (in any state, including one put earlier in this call)
local answers = {}
for i = 1, #ARGV, 4 do
  local dedupe = opt(ARGV[i + 1])
  if dedupe and redis.call('HEXISTS', DEDUPE, dedupe) == 1 then
    answers[#answers + 1] = false
  else
    local id = redis.call('INCR', SEQ)
    local key, available = item_key(id), now + tonumber(ARGV[i + 2])
    redis.call('HSET', key, 'payload', ARGV[i], 'state', 'ready', 'attempts', '0',
               'max_attempts', s(tonumber(ARGV[i + 3])), 'fence', '0',
               'available', s(available), 'created', s(now))
    if dedupe then
      redis.call('HSET', key, 'dedupe', dedupe)
      redis.call('HSET', DEDUPE, dedupe, s(id))
    end
    redis.call('ZADD', READY, s(available), member(id))
    redis.call('ZADD', IDS, s(id), member(id))
    answers[#answers + 1] = id
  end
end
return answers

-- name: queue_claim
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: holder, limit (> 0), visibility_us
-- takes the first limit claimable items — ready ones due at TIME and claimed ones whose
-- claim expired, both scored by available_us — oldest available_us first, then lowest id;
-- each becomes claimed by holder (attempts + 1, fence = max(fence + 1, TIME), available =
-- TIME + visibility_us), except an expired claim with its deliveries used up, which
-- becomes dead ('claim expired after N deliveries') and is not returned
-- returns the claimed item rows, in that order
local holder, limit, visibility = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local expiry = now + visibility
local rows = {}
for _, due in ipairs(earliest({READY, CLAIMED}, now, limit)) do
  local id, set = tonumber(due[2]), due[3]
  local key = item_key(id)
  local r = redis.call('HMGET', key, 'attempts', 'max_attempts', 'fence')
  local attempts = tonumber(r[1])
  if not attempts then
    redis.call('ZREM', set, due[2]) -- an index entry whose item was deleted by hand
  elseif set == CLAIMED and attempts >= tonumber(r[2]) then
    redis.call('HSET', key, 'state', 'dead', 'finished', s(now),
               'error', 'claim expired after ' .. s(attempts) .. ' deliveries')
    move(id, CLAIMED, DEAD, now)
  else
    redis.call('HSET', key, 'state', 'claimed', 'attempts', s(attempts + 1),
               'fence', s(math.max(tonumber(r[3]) + 1, now)), 'holder', holder,
               'available', s(expiry))
    move(id, set, CLAIMED, expiry)
    rows[#rows + 1] = item_row(id)
  end
end
return rows

-- name: queue_extend
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: visibility_us, then 2 per claim: item_id, fence
-- returns one answer per claim, in order: the new claim expiry (TIME + visibility_us) of
-- an item held under that fence, else false (nothing changes for it)
local expiry = now + tonumber(ARGV[1])
local answers = {}
for i = 2, #ARGV, 2 do
  local id = tonumber(ARGV[i])
  if held(id, ARGV[i + 1]) then
    redis.call('HSET', item_key(id), 'available', s(expiry))
    redis.call('ZADD', CLAIMED, s(expiry), member(id))
    answers[#answers + 1] = expiry
  else
    answers[#answers + 1] = false
  end
end
return answers

-- name: queue_ack
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: 2 per claim: item_id, fence
-- makes each item held under that fence done (finished at TIME); returns one answer per
-- claim, in order: 1 when done, 0 when not held (nothing changes for it)
local answers = {}
for i = 1, #ARGV, 2 do
  local id = tonumber(ARGV[i])
  if held(id, ARGV[i + 1]) then
    redis.call('HSET', item_key(id), 'state', 'done', 'finished', s(now))
    move(id, CLAIMED, DONE, now)
    answers[#answers + 1] = 1
  else
    answers[#answers + 1] = 0
  end
end
return answers

-- name: queue_nack
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: 4 per nack: item_id, fence, error, retry_in_us
-- gives back each item held under that fence, with the error: dead (finished at TIME)
-- when its deliveries are used up, else ready again at TIME + retry_in_us, holder
-- cleared; returns one answer per nack, in order: the new state, or false when not held
-- (nothing changes for it)
local answers = {}
for i = 1, #ARGV, 4 do
  local id = tonumber(ARGV[i])
  local mine, attempts, most = held(id, ARGV[i + 1])
  local key = item_key(id)
  if not mine then
    answers[#answers + 1] = false
  elseif tonumber(attempts) >= tonumber(most) then
    redis.call('HSET', key, 'state', 'dead', 'finished', s(now), 'error', ARGV[i + 2])
    move(id, CLAIMED, DEAD, now)
    answers[#answers + 1] = 'dead'
  else
    local available = now + tonumber(ARGV[i + 3])
    redis.call('HSET', key, 'state', 'ready', 'available', s(available), 'error', ARGV[i + 2])
    redis.call('HDEL', key, 'holder')
    move(id, CLAIMED, READY, available)
    answers[#answers + 1] = 'ready'
  end
end
return answers

-- name: queue_get
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: item_id
-- returns the item row, or false
return item_row(tonumber(ARGV[1]))

-- name: queue_list
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: limit (> 0), then the states to list (none: any)
-- returns up to limit item rows in those states, newest id first
local limit = tonumber(ARGV[1])
local members = {}
if #ARGV == 1 then
  members = redis.call('ZREVRANGE', IDS, 0, limit - 1)
else
  local wanted, sets, count = {}, {}, 0
  for i = 2, #ARGV do
    local set = SET_OF[ARGV[i]]
    if set and not wanted[ARGV[i]] then
      wanted[ARGV[i]] = true
      sets[#sets + 1] = set
      count = count + redis.call('ZCARD', set)
    end
  end
  -- The state sets are ordered by time, not id. Two ways to the newest ids in them: read
  -- all their members and sort (cost: count), or walk every id newest first keeping those
  -- in the states (cost: about limit * total / count). Take the cheaper, so that listing
  -- a few dead items among many done ones, or the newest of many ready ones, stays short.
  if count * count <= limit * redis.call('ZCARD', IDS) then
    for _, set in ipairs(sets) do
      for _, m in ipairs(redis.call('ZRANGE', set, 0, -1)) do members[#members + 1] = m end
    end
    table.sort(members, function(a, b) return a > b end)
    for i = #members, limit + 1, -1 do members[i] = nil end
  else
    local CHUNK, start = 100, 0
    while #members < limit do
      local chunk = redis.call('ZREVRANGE', IDS, start, start + CHUNK - 1)
      if #chunk == 0 then break end
      for _, m in ipairs(chunk) do
        local state = redis.call('HGET', item_key(tonumber(m)), 'state')
        if state and wanted[state] then
          members[#members + 1] = m
          if #members >= limit then break end
        end
      end
      start = start + CHUNK
    end
  end
end
local rows = {}
for _, m in ipairs(members) do
  local row = item_row(tonumber(m))
  if row then rows[#rows + 1] = row end
end
return rows

-- name: queue_stats
-- uses: now, queue
-- KEYS: the queue's keys; no ARGV
-- returns false when the queue has no items, else how it stands at TIME: ready
-- (claimable: ready and due, or a claim that expired), scheduled (ready, not yet due),
-- claimed (held), done, dead, oldest_us (the earliest available_us of a claimable item;
-- false: none), now_us:
-- row stats: {ready, scheduled, claimed, done, dead, oldest_us, now_us}
if redis.call('ZCARD', IDS) == 0 then return false end
local t = s(now)
local oldest = false
for _, set in ipairs({READY, CLAIMED}) do
  local first = redis.call('ZRANGEBYSCORE', set, '-inf', t, 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] and (not oldest or tonumber(first[2]) < oldest) then
    oldest = tonumber(first[2])
  end
end
return {redis.call('ZCOUNT', READY, '-inf', t) + redis.call('ZCOUNT', CLAIMED, '-inf', t),
        redis.call('ZCOUNT', READY, '(' .. t, '+inf'),
        redis.call('ZCOUNT', CLAIMED, '(' .. t, '+inf'),
        redis.call('ZCARD', DONE), redis.call('ZCARD', DEAD), oldest, now}

-- name: queue_prune
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: older_than_us, limit (> 0)
-- deletes up to limit done and dead items finished at or before TIME - older_than_us,
-- oldest finish first, then lowest id, freeing their dedupe keys; returns how many
local cutoff = now - tonumber(ARGV[1])
local deleted = 0
for _, found in ipairs(earliest({DONE, DEAD}, cutoff, tonumber(ARGV[2]))) do
  deleted = deleted + drop(tonumber(found[2]), cutoff)
end
return deleted

-- name: queue_prunable
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: older_than_us, limit (> 0)
-- deletes nothing; returns the items queue_prune would delete, in its order, as
-- {finished_us, item_id} pairs (the first step of a prune over many queues)
local found = {}
local cutoff = now - tonumber(ARGV[1])
for _, entry in ipairs(earliest({DONE, DEAD}, cutoff, tonumber(ARGV[2]))) do
  found[#found + 1] = {entry[1], tonumber(entry[2])}
end
return found

-- name: queue_drop
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: older_than_us, then item ids
-- deletes each named item that is still done or dead and finished at or before TIME -
-- older_than_us (one requeued since it was chosen stays), freeing its dedupe key;
-- returns how many
local cutoff = now - tonumber(ARGV[1])
local deleted = 0
for i = 2, #ARGV do deleted = deleted + drop(tonumber(ARGV[i]), cutoff) end
return deleted

-- name: queue_requeue
-- uses: now, queue
-- KEYS: the queue's keys; ARGV: item ids
-- puts each dead item back: ready at TIME, attempts 0, finished and holder cleared (error
-- and fence kept); returns how many were dead
local count = 0
for i = 1, #ARGV do
  local id = tonumber(ARGV[i])
  local key = item_key(id)
  if redis.call('HGET', key, 'state') == 'dead' then
    redis.call('HSET', key, 'state', 'ready', 'attempts', '0', 'available', s(now))
    redis.call('HDEL', key, 'finished', 'holder')
    move(id, DEAD, READY, now)
    count = count + 1
  end
end
return count
