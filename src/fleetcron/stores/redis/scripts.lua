-- Redis scripts of the fleetcron store, one named block each (`-- name: x`), read by the
-- same loader as the SQL files. A block's `-- uses:` line names the blocks put before
-- it: `now` (the server's TIME as `now`, in µs, and `s()` to format an integer) and
-- `ledger` (row helpers of the run ledger). Every script documents its KEYS, its ARGV and
-- what it returns. A script that returns a row returns a flat list whose layout its header
-- declares once, `-- row NAME: {column, …}`, with the column names of the SQL stores:
-- fleetcron.stores.redis.scripts reads the declarations, and the reply is decoded by those
-- names, by the decoder of the record that the SQL stores use (fleetcron.stores.rows).
-- Numbers come back as integers (exact below 2^53) and NULL as false.

-- name: now
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function s(n) return string.format('%d', n) end

-- name: ledger
local RUN_FIELDS = {'job', 'slot', 'state', 'attempt', 'fence', 'holder', 'run_id', 'trigger',
                    'started', 'finished', 'expires', 'retry_at', 'cancel', 'exit_code',
                    'error', 'output'}
local JOB_FIELDS = {'job', 'paused', 'definition', 'fingerprint', 'high_water',
                    'last_success', 'last_failure', 'updated'}
-- a number field as an integer, an absent one as false (NULL)
local function int(v)
  if v then return tonumber(v) end
  return false
end
-- a run row (cancel_requested 0/1), false when absent:
-- row run: {job, slot_us, state, attempt, fence, holder, run_id, trigger, started_us,
--           finished_us, expires_us, retry_at_us, cancel_requested, exit_code, error,
--           output, now_us}
local function run_row(key)
  local r = redis.call('HMGET', key, unpack(RUN_FIELDS))
  if not r[3] then return false end
  return {r[1], int(r[2]), r[3], int(r[4]), int(r[5]), r[6], r[7], r[8], int(r[9]),
          int(r[10]), int(r[11]), int(r[12]), int(r[13]) or 0, int(r[14]), r[15], r[16], now}
end
-- a job row (paused 0/1), false when absent:
-- row job: {job, paused, definition, fingerprint, high_water_us, last_success_us,
--           last_failure_us, updated_us, now_us}
local function job_row(key)
  local r = redis.call('HMGET', key, unpack(JOB_FIELDS))
  if not r[1] then return false end
  return {r[1], int(r[2]) or 0, r[3] or '{}', r[4] or '', int(r[5]), int(r[6]), int(r[7]),
          int(r[8]), now}
end
-- a job row without its definition ('' instead), false when absent (layout: row job)
local function job_row_brief(key)
  local r = redis.call('HMGET', key, 'job', 'paused', 'fingerprint', 'high_water',
                       'last_success', 'last_failure', 'updated')
  if not r[1] then return false end
  return {r[1], int(r[2]) or 0, '', r[3] or '', int(r[4]), int(r[5]), int(r[6]), int(r[7]), now}
end
-- an optional argument: '' is NULL, else '=' .. value
local function opt(v)
  if v == '' then return nil end
  return string.sub(v, 2)
end
-- create the job row of a job nobody registered yet
local function ensure_job(key, job)
  if redis.call('HEXISTS', key, 'job') == 0 then
    redis.call('HSET', key, 'job', job, 'paused', '0', 'definition', '{}', 'fingerprint', '',
               'updated', s(now))
  end
end
local function raise_high_water(key, slot)
  local high = redis.call('HGET', key, 'high_water')
  if not high or tonumber(high) < tonumber(slot) then
    redis.call('HSET', key, 'high_water', slot)
  end
end
-- the run row of a slot listed in the slot index KEYS[1] (same hash tag)
local function run_key_of(slot)
  return string.sub(KEYS[1], 1, -7) .. ':run:' .. slot
end

-- name: lease_acquire
-- uses: now
-- KEYS[1] lease hash; ARGV: holder, ttl_us, least_us, namespace, name
-- returns false when held at TIME, else the fence and TIME as integers (exact below 2^53;
-- the caller derives expires = now + ttl and min_until = now + least):
-- row acquired: {fence, now_us}
local cur = redis.call('HMGET', KEYS[1], 'expires', 'fence')
if cur[1] and tonumber(cur[1]) > now then return false end
local fence = now
if cur[2] and tonumber(cur[2]) + 1 > fence then fence = tonumber(cur[2]) + 1 end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'fence', s(fence), 'acquired', s(now),
           'expires', s(now + tonumber(ARGV[2])), 'min_until', s(now + tonumber(ARGV[3])))
if not cur[2] then redis.call('HSET', KEYS[1], 'ns', ARGV[4], 'name', ARGV[5]) end
return {fence, now}

-- name: lease_extend
-- uses: now
-- KEYS[1] lease hash; ARGV: holder, fence, ttl_us
-- returns false unless held by exactly (holder, fence), else the lease row after the
-- renewal:
-- row lease: {name, holder, fence, acquired_us, expires_us, min_until_us, now_us}
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'expires', 'min_until', 'acquired',
                      'name')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then return false end
local expires = math.max(now + tonumber(ARGV[3]), tonumber(cur[4]))
redis.call('HSET', KEYS[1], 'expires', s(expires))
return {cur[6], cur[1], tonumber(cur[2]), tonumber(cur[5]), expires, tonumber(cur[4]), now}

-- name: lease_release
-- uses: now
-- KEYS[1] lease hash; ARGV: holder, fence
-- returns 1 when released (expiry = max(now, min_until)), 0 when not ours: nothing changes
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'expires', 'min_until')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then return 0 end
redis.call('HSET', KEYS[1], 'expires', s(math.max(now, tonumber(cur[4]))))
return 1

-- name: lease_get
-- uses: now
-- KEYS[1] lease hash; returns false when absent, else the lease row:
-- row lease: {name, holder, fence, acquired_us, expires_us, min_until_us, now_us}
local cur = redis.call('HMGET', KEYS[1],
                      'holder', 'fence', 'acquired', 'expires', 'min_until', 'name')
if not cur[2] then return false end
return {cur[6], cur[1], tonumber(cur[2]), tonumber(cur[3]), tonumber(cur[4]), tonumber(cur[5]),
        now}

-- name: lease_prune
-- uses: now
-- KEYS[1] lease hash; ARGV: older_than_us, dry_run (1/0)
-- returns the name when the row is (or would be) deleted, else false
local cur = redis.call('HMGET', KEYS[1], 'expires', 'min_until', 'fence', 'name')
if not cur[1] then return false end
local limit = now - tonumber(ARGV[1])
if tonumber(cur[1]) < limit and tonumber(cur[2]) < limit and tonumber(cur[3]) < now then
  if ARGV[2] == '0' then redis.call('DEL', KEYS[1]) end
  return cur[4]
end
return false

-- name: run_claim
-- uses: now, ledger
-- KEYS: 4 per claim: job lease, job row, run row, slot index
-- ARGV: holder, ttl_us, namespace, lost error, missed error, then 11 per claim: slot_us,
--       run_id, exclusive (1/0), max_attempts, trigger, least_us, job, lease name,
--       deadline_us? (optional: '' is none), progress (1/0: claiming or missing the slot
--       moves the high-water mark), pausable (1/0: a paused job refuses the claim); then,
--       when any claim of the call carries one, a fingerprint? per claim (the claimer's
--       definition of the job; '' or absent: no check)
-- returns one reply per claim, in order: the claimed run row (see run_row), or why the
-- slot was not claimed: 'not_due', 'conflict:<registered fingerprint>' (the claim was made
-- for another definition than the registered one: nothing is written), 'paused', 'taken',
-- 'missed' or 'busy'. Every claim is decided at the same TIME, in order, each one seeing
-- the writes of those before it.
local holder, ttl, namespace, lost_error = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local missed_error = ARGV[5]
local function claim(lease_key, job_key, run_key, slots_key, slot_arg, run_id, exclusive,
                     max_attempts, trigger, least, job, lease_name, deadline_arg, progress,
                     pausable, fingerprint_arg)
  local slot = tonumber(slot_arg)
  if slot > now then return 'not_due' end
  local row = redis.call('HMGET', job_key, 'paused', 'fingerprint')
  local mine = opt(fingerprint_arg)
  if mine and row[2] and row[2] ~= '' and row[2] ~= mine then
    return 'conflict:' .. row[2]
  end
  if pausable == '1' and row[1] == '1' then
    return 'paused'
  end
  local attempt, note = 1, nil
  local run = redis.call('HMGET', run_key, 'state', 'attempt', 'expires', 'retry_at')
  if run[1] then
    local tried, most = tonumber(run[2]), tonumber(max_attempts)
    if run[1] == 'running' and run[3] and tonumber(run[3]) <= now then
      if tried >= most then
        redis.call('HSET', run_key, 'state', 'lost', 'finished', s(now), 'error', lost_error)
        redis.call('HDEL', run_key, 'expires')
        return 'taken'
      end
      attempt, note = tried + 1, 'attempt ' .. run[2] .. ' lost: ' .. lost_error
    elseif run[1] == 'queued' then
      attempt = 1
    elseif run[1] == 'failed' and run[4] and tonumber(run[4]) <= now and tried < most then
      attempt = tried + 1
    else
      return 'taken'
    end
  else
    local deadline = opt(deadline_arg)
    if deadline and now > tonumber(deadline) then
      -- no row and past the claim's deadline: recorded as missed, not run
      redis.call('HSET', run_key, 'job', job, 'slot', slot_arg, 'state', 'missed',
                 'attempt', '0', 'fence', '0', 'holder', '', 'run_id', '', 'trigger', trigger,
                 'finished', s(now), 'cancel', '0', 'error', missed_error)
      redis.call('ZADD', slots_key, slot_arg, slot_arg)
      ensure_job(job_key, job)
      if progress == '1' then raise_high_water(job_key, slot_arg) end
      return 'missed'
    end
  end
  local lease = redis.call('HMGET', lease_key, 'expires', 'fence')
  if exclusive == '1' and lease[1] and tonumber(lease[1]) > now then return 'busy' end
  local fence = now
  if lease[2] and tonumber(lease[2]) + 1 > fence then fence = tonumber(lease[2]) + 1 end
  if exclusive == '1' then
    redis.call('HSET', lease_key, 'holder', holder, 'fence', s(fence), 'acquired', s(now),
               'expires', s(now + ttl), 'min_until', s(now + tonumber(least)))
  elseif lease[2] then
    redis.call('HSET', lease_key, 'fence', s(fence))
  else
    redis.call('HSET', lease_key, 'holder', '', 'fence', s(fence), 'acquired', '0',
               'expires', '0', 'min_until', '0')
  end
  if not lease[2] then redis.call('HSET', lease_key, 'ns', namespace, 'name', lease_name) end
  redis.call('DEL', run_key)
  redis.call('HSET', run_key, 'job', job, 'slot', slot_arg, 'state', 'running',
             'attempt', s(attempt), 'fence', s(fence), 'holder', holder, 'run_id', run_id,
             'trigger', trigger, 'started', s(now), 'expires', s(now + ttl), 'cancel', '0')
  if note then redis.call('HSET', run_key, 'error', note) end
  redis.call('ZADD', slots_key, slot_arg, slot_arg)
  ensure_job(job_key, job)
  if progress == '1' then raise_high_water(job_key, slot_arg) end
  return run_row(run_key)
end
local replies = {}
local count = #KEYS / 4
for i = 1, count do
  local k, a = (i - 1) * 4, 5 + (i - 1) * 11
  replies[i] = claim(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
                     ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
                     ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9],
                     ARGV[a + 10], ARGV[a + 11], ARGV[5 + count * 11 + i] or '')
end
return replies

-- name: run_extend
-- uses: now, ledger
-- KEYS[1] job lease, KEYS[2] run row; ARGV: fence, ttl_us
-- returns false unless the attempt is running, holds the fence and is unexpired,
-- else the renewed run row (its cancel field tells the holder to stop)
local run = redis.call('HMGET', KEYS[2], 'state', 'fence', 'expires')
if run[1] ~= 'running' or run[2] ~= ARGV[1] or not run[3] or tonumber(run[3]) <= now then
  return false
end
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[2], 'expires', s(now + ttl))
local lease = redis.call('HMGET', KEYS[1], 'fence', 'expires', 'min_until')
if lease[1] == ARGV[1] and tonumber(lease[2]) > now then
  redis.call('HSET', KEYS[1], 'expires', s(math.max(now + ttl, tonumber(lease[3]))))
end
return run_row(KEYS[2])

-- name: run_finish
-- uses: now, ledger
-- KEYS[1] job lease, KEYS[2] job row, KEYS[3] run row
-- ARGV: fence, state, exit_code?, error?, output?, retry_after_us?, job  (? = optional)
-- returns 1 when recorded, 0 when the attempt is no longer ours (nothing changes)
local run = redis.call('HMGET', KEYS[3], 'state', 'fence', 'expires')
if run[1] ~= 'running' or run[2] ~= ARGV[1] or not run[3] or tonumber(run[3]) <= now then
  return 0
end
redis.call('HDEL', KEYS[3], 'expires', 'retry_at', 'exit_code', 'error', 'output')
redis.call('HSET', KEYS[3], 'state', ARGV[2], 'finished', s(now))
local exit_code, err, output, retry = opt(ARGV[3]), opt(ARGV[4]), opt(ARGV[5]), opt(ARGV[6])
if exit_code then redis.call('HSET', KEYS[3], 'exit_code', exit_code) end
if err then redis.call('HSET', KEYS[3], 'error', err) end
if output then redis.call('HSET', KEYS[3], 'output', output) end
if ARGV[2] == 'failed' and retry then
  redis.call('HSET', KEYS[3], 'retry_at', s(now + tonumber(retry)))
end
local lease = redis.call('HMGET', KEYS[1], 'fence', 'min_until')
if lease[1] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'expires', s(math.max(now, tonumber(lease[2]))))
end
ensure_job(KEYS[2], ARGV[7])
if ARGV[2] == 'succeeded' then
  redis.call('HSET', KEYS[2], 'last_success', s(now))
elseif ARGV[2] == 'failed' or ARGV[2] == 'lost' then
  redis.call('HSET', KEYS[2], 'last_failure', s(now))
end
return 1

-- name: run_record
-- uses: now, ledger
-- KEYS[1] job row, KEYS[2] run row, KEYS[3] slot index
-- ARGV: slot_us, state, error?, trigger, job
-- returns 1 when the final row was inserted, 0 when the slot has a row (never overwritten)
-- or the slot is later than TIME (never a row for a slot not yet due)
if redis.call('EXISTS', KEYS[2]) == 1 or tonumber(ARGV[1]) > now then return 0 end
redis.call('HSET', KEYS[2], 'job', ARGV[5], 'slot', ARGV[1], 'state', ARGV[2],
           'attempt', '0', 'fence', '0', 'holder', '', 'run_id', '', 'trigger', ARGV[4],
           'finished', s(now), 'cancel', '0')
local err = opt(ARGV[3])
if err then redis.call('HSET', KEYS[2], 'error', err) end
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
ensure_job(KEYS[1], ARGV[5])
if ARGV[2] ~= 'queued' then raise_high_water(KEYS[1], ARGV[1]) end
return 1

-- name: run_backfill
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: job, then the slots (µs), distinct, oldest first
-- queues a backfill run of each slot that has no row and that TIME has reached (never
-- overwrites); returns how many it queued. Every check comes before the first write:
-- Redis refuses a script (out of memory, a read-only replica) only before its first write
-- and never undoes one, so the rows are all written or none.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. kind ..
                           ', not a slot index; nothing was queued')
end
local fresh = {}
for i = 2, #ARGV do
  if tonumber(ARGV[i]) <= now and redis.call('EXISTS', run_key_of(ARGV[i])) == 0 then
    fresh[#fresh + 1] = ARGV[i]
  end
end
for _, slot in ipairs(fresh) do
  redis.call('HSET', run_key_of(slot), 'job', ARGV[1], 'slot', slot, 'state', 'queued',
             'attempt', '0', 'fence', '0', 'holder', '', 'run_id', '', 'trigger', 'backfill',
             'finished', s(now), 'cancel', '0')
  redis.call('ZADD', KEYS[1], slot, slot)
end
return #fresh

-- name: run_cancel
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: slot_us (optional: every slot when NULL), note (optional)
-- sets cancel (and, with a note, error) on the job's unexpired running rows, of that slot
-- only when given; returns how many
local slot, note = opt(ARGV[1]), opt(ARGV[2])
local slots = {slot}
if not slot then slots = redis.call('ZRANGE', KEYS[1], 0, -1) end
local asked = 0
for _, each in ipairs(slots) do
  local key = run_key_of(each)
  local run = redis.call('HMGET', key, 'state', 'expires')
  if run[1] == 'running' and run[2] and tonumber(run[2]) > now then
    redis.call('HSET', key, 'cancel', '1')
    if note then redis.call('HSET', key, 'error', note) end
    asked = asked + 1
  end
end
return asked

-- name: run_get
-- uses: now, ledger
-- KEYS[1] run row; returns the run row or false
return run_row(KEYS[1])

-- name: run_settled
-- KEYS[1] run row; returns 1 when it exists in a state other than queued, else 0
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then return 1 end
return 0

-- name: run_list
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: limit (> 0), and optionally 0 for the rows without their output
-- returns up to limit run rows of the job, newest slot first
local with_output = ARGV[2] ~= '0'
local rows = {}
for _, slot in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local row = run_row(run_key_of(slot))
  if row then
    if not with_output then row[16] = false end
    rows[#rows + 1] = row
  end
end
return rows

-- name: run_running
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: limit (> 0)
-- returns the run rows in state running among the job's newest limit rows, newest slot
-- first: only their state is read of the others
local rows = {}
for _, slot in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local key = run_key_of(slot)
  if redis.call('HGET', key, 'state') == 'running' then
    rows[#rows + 1] = run_row(key)
  end
end
return rows

-- name: run_due
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: limit (> 0)
-- returns up to limit rows of the job to claim now, oldest slot first: queued, running
-- with an expired lease, failed with a retry that has come (TIME decides)
local rows = {}
for _, slot in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local key = run_key_of(slot)
  local run = redis.call('HMGET', key, 'state', 'expires', 'retry_at')
  local due = run[1] == 'queued'
    or (run[1] == 'running' and run[2] and tonumber(run[2]) <= now)
    or (run[1] == 'failed' and run[3] and tonumber(run[3]) <= now)
  if due then
    rows[#rows + 1] = run_row(key)
    if #rows >= tonumber(ARGV[1]) then break end
  end
end
return rows

-- name: run_prune
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: keep, older_than_us
-- deletes the job's final rows beyond the newest keep or finished before now - older_than;
-- never a running row; returns how many were deleted
local keep, limit = tonumber(ARGV[1]), now - tonumber(ARGV[2])
local index, deleted = 0, 0
for _, slot in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, -1)) do
  local key = run_key_of(slot)
  local run = redis.call('HMGET', key, 'state', 'finished')
  if not run[1] then
    redis.call('ZREM', KEYS[1], slot)
  elseif run[1] ~= 'running' and run[1] ~= 'queued' then
    if index >= keep or (run[2] and tonumber(run[2]) < limit) then
      redis.call('DEL', key)
      redis.call('ZREM', KEYS[1], slot)
      deleted = deleted + 1
    end
    index = index + 1
  end
end
return deleted

-- name: run_prune_job
-- uses: now, ledger
-- KEYS[1] slot index; ARGV: keep, older_than_us, limit (> 0), dry_run (1/0)
-- retention of one job: deletes up to limit of its finished rows (final, no retry pending)
-- beyond its newest keep finished rows and finished before now - older_than, oldest slot
-- first; returns how many were (dry_run: would be) deleted. A slot is never later than its
-- row's finish, so only slots below now - older_than are read, in chunks, from the oldest.
local keep, limit, dry = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4] == '1'
local before = now - tonumber(ARGV[2])
local CHUNK = 100
local function finished(run)
  return run[1] and run[1] ~= 'running' and run[1] ~= 'queued'
    and not (run[1] == 'failed' and run[3])
end
local bound = before -- slots below it may go
if keep > 0 then
  local seen, start, cut = 0, 0, nil
  while not cut do
    local chunk = redis.call('ZREVRANGE', KEYS[1], start, start + CHUNK - 1)
    if #chunk == 0 then return 0 end -- fewer finished rows than keep: all stay
    for _, slot in ipairs(chunk) do
      if finished(redis.call('HMGET', run_key_of(slot), 'state', 'finished', 'retry_at')) then
        seen = seen + 1
        if seen == keep then cut = tonumber(slot) break end
      end
    end
    start = start + CHUNK
  end
  if cut < bound then bound = cut end
end
local deleted, low = 0, '-inf'
while deleted < limit do
  local chunk = redis.call('ZRANGEBYSCORE', KEYS[1], low, '(' .. s(bound), 'LIMIT', 0, CHUNK)
  if #chunk == 0 then break end
  for _, slot in ipairs(chunk) do
    local key = run_key_of(slot)
    local run = redis.call('HMGET', key, 'state', 'finished', 'retry_at')
    if not run[1] then
      if not dry then redis.call('ZREM', KEYS[1], slot) end -- an index entry without a row
    elseif finished(run) and run[2] and tonumber(run[2]) < before then
      if not dry then
        redis.call('DEL', key)
        redis.call('ZREM', KEYS[1], slot)
      end
      deleted = deleted + 1
      if deleted >= limit then break end
    end
  end
  low = '(' .. chunk[#chunk]
end
return deleted

-- name: job_delete
-- uses: now, ledger
-- KEYS[1] slot index, KEYS[2] job row; ARGV: dry_run (1/0)
-- deletes the job row unless the job has a queued or running run; returns 1 when it was
-- (dry_run: would be) deleted, 0 when it has such a run or no row (nothing changes). The
-- run rows and the slot index stay.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
for _, slot in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local state = redis.call('HGET', run_key_of(slot), 'state')
  if state == 'queued' or state == 'running' then return 0 end
end
if ARGV[1] ~= '1' then redis.call('DEL', KEYS[2]) end
return 1

-- name: job_register
-- uses: now, ledger
-- KEYS[1] job row; ARGV: job, definition, fingerprint
-- upserts the definition (paused and progress kept); returns the row before, or false
local before = job_row(KEYS[1])
ensure_job(KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], 'definition', ARGV[2], 'fingerprint', ARGV[3], 'updated', s(now))
return before

-- name: job_set_paused
-- uses: now, ledger
-- KEYS[1] job row, KEYS[2] slot index; ARGV: paused (1/0), job
-- pausing a job no replica registered yet makes its row (no definition; a registration
-- fills it in and keeps the pause); resuming a row that holds nothing but such a pause (no
-- definition, no progress, no run row) deletes it; returns 0 when resuming a job with no
-- row, else 1
if ARGV[1] == '1' then
  ensure_job(KEYS[1], ARGV[2])
elseif redis.call('HEXISTS', KEYS[1], 'job') == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'paused', ARGV[1], 'updated', s(now))
if ARGV[1] == '0' then
  local r = redis.call('HMGET', KEYS[1], 'definition', 'fingerprint', 'high_water',
                       'last_success', 'last_failure')
  if (not r[1] or r[1] == '' or r[1] == '{}') and (not r[2] or r[2] == '')
     and not r[3] and not r[4] and not r[5] and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])
  end
end
return 1

-- name: job_get
-- uses: now, ledger
-- KEYS[1] job row; returns the job row or false
return job_row(KEYS[1])

-- name: job_get_brief
-- uses: now, ledger
-- KEYS[1] job row; returns the job row with '' for its definition (job_page without
-- definitions: the bulk of the row is not sent), or false
local row = job_row_brief(KEYS[1])
return row

-- name: store_now
-- uses: now
-- no KEYS, no ARGV; returns the server's TIME in µs (an integer)
return now

-- name: replica_beat
-- uses: now
-- KEYS[1] the namespace's replica index (sorted set: replica id, score expires_us),
-- KEYS[2] this replica's hash; the other replicas' hashes are the index key with
-- ':index' replaced by ':replica:<id>' (same hash tag)
-- ARGV: replica_id, host, pid, version, mode, jobs_fingerprint, ttl_us, retain_us,
--       prune_limit
-- deletes up to prune_limit other replicas that expired more than retain_us ago, upserts
-- this one (started kept while its hash exists; the hash expires by itself retain_us after
-- the row does) and returns its row:
-- row replica: {replica_id, host, pid, version, mode, jobs_fingerprint, started_us,
--               last_seen_us, expires_us, now_us}
local ttl, retain = tonumber(ARGV[7]), tonumber(ARGV[8])
local base = string.sub(KEYS[1], 1, -7) .. ':replica:'
local doomed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. s(now - retain),
                          'LIMIT', 0, tonumber(ARGV[9]))
for _, id in ipairs(doomed) do
  if id ~= ARGV[1] then
    redis.call('DEL', base .. id)
    redis.call('ZREM', KEYS[1], id)
  end
end
local started = redis.call('HGET', KEYS[2], 'started') or s(now)
local expires = now + ttl
redis.call('HSET', KEYS[2], 'id', ARGV[1], 'host', ARGV[2], 'pid', ARGV[3],
           'version', ARGV[4], 'mode', ARGV[5], 'jobs', ARGV[6], 'started', started,
           'seen', s(now), 'expiry', s(expires))
local keep_ms = math.ceil((ttl + retain) / 1000)
redis.call('PEXPIRE', KEYS[2], keep_ms)
redis.call('ZADD', KEYS[1], s(expires), ARGV[1])
if redis.call('PTTL', KEYS[1]) < keep_ms then redis.call('PEXPIRE', KEYS[1], keep_ms) end
return {ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], tonumber(started),
        now, expires, now}

-- name: replica_list
-- uses: now
-- KEYS[1] the namespace's replica index; ARGV: gone_within_us
-- returns the rows with expires_us > now - gone_within_us (the live replicas, and those
-- gone within it), each as replica_beat's:
-- row replica: {replica_id, host, pid, version, mode, jobs_fingerprint, started_us,
--               last_seen_us, expires_us, now_us}
local base = string.sub(KEYS[1], 1, -7) .. ':replica:'
local rows = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. s(now - tonumber(ARGV[1])), '+inf')
for _, id in ipairs(ids) do
  local r = redis.call('HMGET', base .. id, 'id', 'host', 'pid', 'version', 'mode', 'jobs',
                       'started', 'seen', 'expiry')
  if r[1] then
    rows[#rows + 1] = {r[1], r[2], tonumber(r[3]), r[4], r[5], r[6], tonumber(r[7]),
                       tonumber(r[8]), tonumber(r[9]), now}
  end
end
return rows

-- name: replica_leave
-- KEYS[1] the namespace's replica index, KEYS[2] the replica's hash; ARGV: replica_id
-- returns 1 when the replica had a row, else 0
local had = redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[1])
return had
