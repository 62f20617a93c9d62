"""Redis store (redis-py): one Lua script per operation, so each is one round trip.

A lease is a hash with no TTL — like a SQL row it stays until ``prune`` — and expiry is
decided inside the script by the server's ``TIME``. The fence is
``max(previous + 1, TIME in µs)``: it keeps increasing even after a restart that lost
every key, as long as the server clock does not step back. Keys are hash-tagged
``fleetcron:{<len(ns)>:<ns>:<name>}`` so each operation touches one Cluster slot.

The run ledger (docs/design/ledger.md) lives under the hash tag of the job's lease
(``fleetcron:job:<job>``), so one claim — job lease, job row, run row, slot index — is one
Cluster slot and one atomic script. With ``B = fleetcron:{<len(ns)>:<ns>:fleetcron:job:<job>}``:

- ``B`` — the job lease (a lease hash like any other);
- ``B:job`` — the job row: ``job``, ``paused`` (1/0), ``definition``, ``fingerprint``,
  ``high_water``, ``last_success``, ``last_failure``, ``updated``;
- ``B:run:<slot_us>`` — one run row: ``job``, ``slot``, ``state``, ``attempt``, ``fence``,
  ``holder``, ``run_id``, ``trigger``, ``started``, ``finished``, ``expires``,
  ``retry_at``, ``cancel`` (1/0), ``exit_code``, ``error``, ``output``;
- ``B:slots`` — sorted set of the job's slots (member and score ``slot_us``), for listing
  newest first, cancelling and pruning.

NULL is an absent hash field. A lease key ends with ``}``; ledger keys never do, which is
how ``lease_list``/``lease_prune`` tell them apart in a SCAN of the namespace. Jobs of a
namespace are found by SCAN of ``…:fleetcron:job:*}:job`` (no per-namespace index: it
would be another Cluster slot). The scripts of a whole job (``run_list``, ``run_cancel``,
``run_prune``) are given the slot index as their key and reach the run rows named in it;
those rows share its hash tag, so they are in the same slot.

A batch of claims is one round trip (plus one ``SCRIPT LOAD`` after a script cache
flush): a pipeline of ``EVALSHA`` calls of the claim script, each with its own keys and
arguments. On one server the whole batch is one call — one ``TIME``, one atomic step, as
the spec asks. ``RedisOperations(cluster=True)`` splits it into one call per job (each
call's keys share one hash tag), all in the same pipeline; each call then has its own
``TIME``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.commands.core import Script as RedisScript

from fleetcron.errors import ConfigurationError, FleetcronError, StoreError, StoreUnavailable
from fleetcron.models import (
    ClaimResult,
    JobRecord,
    LeaseRecord,
    RunOutcome,
    RunRecord,
    SlotClaim,
    job_lease_name,
)
from fleetcron.stores.base import (
    Capability,
    Operation,
    Statement,
    acquired_record,
    drive,
    drive_async,
)
from fleetcron.stores.ledger import LOST_ERROR, MISSED_ERROR, OUTPUT_LIMIT
from fleetcron.stores.statements import KeyScan, Script, ScriptArg, ScriptCalls, fan_out
from fleetcron.stores.url import StoreURL

__all__ = [
    "AsyncRedisStore",
    "RedisOperations",
    "RedisStore",
    "job_key",
    "lease_key",
    "run_key",
    "slots_key",
]

T = TypeVar("T")
log = logging.getLogger("fleetcron")

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function s(n) return string.format('%d', n) end
"""

LEASE_ACQUIRE = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: holder, ttl_us, least_us, namespace, name
-- returns false when held at TIME, else {fence, now} as integers (exact below 2^53;
-- the caller derives expires = now + ttl and min_until = now + least)
local cur = redis.call('HMGET', KEYS[1], 'expires', 'fence')
if cur[1] and tonumber(cur[1]) > now then return false end
local fence = now
if cur[2] and tonumber(cur[2]) + 1 > fence then fence = tonumber(cur[2]) + 1 end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'fence', s(fence), 'acquired', s(now),
           'expires', s(now + tonumber(ARGV[2])), 'min_until', s(now + tonumber(ARGV[3])))
if not cur[2] then redis.call('HSET', KEYS[1], 'ns', ARGV[4], 'name', ARGV[5]) end
return {fence, now}
"""
)

LEASE_EXTEND = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: holder, fence, ttl_us
-- returns false unless held by exactly (holder, fence),
-- else {fence, acquired, expires, min_until, now}
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'expires', 'min_until', 'acquired')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then return false end
local expires = math.max(now + tonumber(ARGV[3]), tonumber(cur[4]))
redis.call('HSET', KEYS[1], 'expires', s(expires))
return {cur[2], cur[5], s(expires), cur[4], s(now)}
"""
)

LEASE_RELEASE = (
    _NOW
    + """
-- KEYS[1] lease hash; ARGV: holder, fence
-- returns 1 when released (expiry = max(now, min_until)), 0 when not ours: nothing changes
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'expires', 'min_until')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then return 0 end
redis.call('HSET', KEYS[1], 'expires', s(math.max(now, tonumber(cur[4]))))
return 1
"""
)

LEASE_GET = (
    _NOW
    + """
-- KEYS[1] lease hash; returns false when absent,
-- else {holder, fence, acquired, expires, min_until, now, name}
local cur = redis.call('HMGET', KEYS[1],
                      'holder', 'fence', 'acquired', 'expires', 'min_until', 'name')
if not cur[2] then return false end
return {cur[1], cur[2], cur[3], cur[4], cur[5], s(now), cur[6]}
"""
)

LEASE_PRUNE = (
    _NOW
    + """
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
"""
)

_LEDGER = """
local RUN_FIELDS = {'job', 'slot', 'state', 'attempt', 'fence', 'holder', 'run_id', 'trigger',
                    'started', 'finished', 'expires', 'retry_at', 'cancel', 'exit_code',
                    'error', 'output'}
local JOB_FIELDS = {'job', 'paused', 'definition', 'fingerprint', 'high_water',
                    'last_success', 'last_failure', 'updated'}
-- a run row as {RUN_FIELDS..., now} (absent fields are nil replies), false when absent
local function run_row(key)
  local row = redis.call('HMGET', key, unpack(RUN_FIELDS))
  if not row[3] then return false end
  row[17] = s(now)
  return row
end
-- a job row as {JOB_FIELDS..., now}, false when absent
local function job_row(key)
  local row = redis.call('HMGET', key, unpack(JOB_FIELDS))
  if not row[1] then return false end
  row[9] = s(now)
  return row
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
"""

RUN_CLAIM = (
    _NOW
    + _LEDGER
    + """
-- KEYS: 4 per claim: job lease, job row, run row, slot index
-- ARGV: holder, ttl_us, namespace, lost error, missed error, then 9 per claim: slot_us,
--       run_id, exclusive (1/0), max_attempts, trigger, least_us, job, lease name,
--       deadline_us? (optional: '' is none)
-- returns one reply per claim, in order: the claimed run row (see run_row), or why the
-- slot was not claimed: 'not_due', 'paused', 'taken', 'missed' or 'busy'. Every claim is
-- decided at the same TIME, in order, each one seeing the writes of those before it.
local holder, ttl, namespace, lost_error = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local missed_error = ARGV[5]
local function claim(lease_key, job_key, run_key, slots_key, slot_arg, run_id, exclusive,
                     max_attempts, trigger, least, job, lease_name, deadline_arg)
  local slot = tonumber(slot_arg)
  if slot > now then return 'not_due' end
  if trigger == 'schedule' and redis.call('HGET', job_key, 'paused') == '1' then
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
      if trigger == 'schedule' or trigger == 'exec' then raise_high_water(job_key, slot_arg) end
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
  if trigger == 'schedule' or trigger == 'exec' then raise_high_water(job_key, slot_arg) end
  return run_row(run_key)
end
local replies = {}
for i = 1, #KEYS / 4 do
  local k, a = (i - 1) * 4, 5 + (i - 1) * 9
  replies[i] = claim(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
                     ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
                     ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9])
end
return replies
"""
)

RUN_EXTEND = (
    _NOW
    + _LEDGER
    + """
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
"""
)

RUN_FINISH = (
    _NOW
    + _LEDGER
    + """
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
"""
)

RUN_RECORD = (
    _NOW
    + _LEDGER
    + """
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
"""
)

RUN_CANCEL = (
    _NOW
    + _LEDGER
    + """
-- KEYS[1] slot index; no ARGV
-- sets cancel on the job's unexpired running rows; returns how many
local asked = 0
for _, slot in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local key = run_key_of(slot)
  local run = redis.call('HMGET', key, 'state', 'expires')
  if run[1] == 'running' and run[2] and tonumber(run[2]) > now then
    redis.call('HSET', key, 'cancel', '1')
    asked = asked + 1
  end
end
return asked
"""
)

RUN_GET = (
    _NOW
    + _LEDGER
    + """
-- KEYS[1] run row; returns the run row or false
return run_row(KEYS[1])
"""
)

RUN_SETTLED = """
-- KEYS[1] run row; returns 1 when it exists in a state other than queued, else 0
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then return 1 end
return 0
"""

RUN_LIST = (
    _NOW
    + _LEDGER
    + """
-- KEYS[1] slot index; ARGV: limit (> 0)
-- returns up to limit run rows of the job, newest slot first
local rows = {}
for _, slot in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local row = run_row(run_key_of(slot))
  if row then rows[#rows + 1] = row end
end
return rows
"""
)

RUN_DUE = (
    _NOW
    + _LEDGER
    + """
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
"""
)

RUN_PRUNE = (
    _NOW
    + _LEDGER
    + """
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
"""
)

JOB_REGISTER = (
    _NOW
    + _LEDGER
    + """
-- KEYS[1] job row; ARGV: job, definition, fingerprint
-- upserts the definition (paused and progress kept); returns the row before, or false
local before = job_row(KEYS[1])
ensure_job(KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], 'definition', ARGV[2], 'fingerprint', ARGV[3], 'updated', s(now))
return before
"""
)

JOB_SET_PAUSED = (
    _NOW
    + _LEDGER
    + """
-- KEYS[1] job row; ARGV: paused (1/0); returns 0 when the job is unknown, else 1
if redis.call('HEXISTS', KEYS[1], 'job') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'paused', ARGV[1], 'updated', s(now))
return 1
"""
)

JOB_GET = (
    _NOW
    + _LEDGER
    + """
-- KEYS[1] job row; returns the job row or false
return job_row(KEYS[1])
"""
)

STORE_NOW = (
    _NOW
    + """
-- no KEYS, no ARGV; returns the server's TIME in µs as a decimal string
return s(now)
"""
)

SCRIPTS = {
    "lease_acquire": LEASE_ACQUIRE,
    "lease_extend": LEASE_EXTEND,
    "lease_release": LEASE_RELEASE,
    "lease_get": LEASE_GET,
    "lease_prune": LEASE_PRUNE,
    "run_claim": RUN_CLAIM,
    "run_extend": RUN_EXTEND,
    "run_finish": RUN_FINISH,
    "run_record": RUN_RECORD,
    "run_cancel": RUN_CANCEL,
    "run_get": RUN_GET,
    "run_settled": RUN_SETTLED,
    "run_list": RUN_LIST,
    "run_due": RUN_DUE,
    "run_prune": RUN_PRUNE,
    "job_register": JOB_REGISTER,
    "job_set_paused": JOB_SET_PAUSED,
    "job_get": JOB_GET,
    "store_now": STORE_NOW,
}


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def lease_key(namespace: str, name: str) -> str:
    """The hash-tagged key of a lease; the length prefix keeps ``ns``/``name`` unambiguous."""
    return f"fleetcron:{{{len(namespace)}:{namespace}:{name}}}"


def _namespace_pattern(namespace: str) -> str:
    return f"fleetcron:{{{len(namespace)}:{_glob_escape(namespace)}:*"


def _job_base(namespace: str, job: str) -> str:
    return lease_key(namespace, job_lease_name(job))


def job_key(namespace: str, job: str) -> str:
    """The job row: under the hash tag of the job's lease."""
    return _job_base(namespace, job) + ":job"


def run_key(namespace: str, job: str, slot_us: int) -> str:
    """The run row of one slot: under the hash tag of the job's lease."""
    return f"{_job_base(namespace, job)}:run:{slot_us}"


def slots_key(namespace: str, job: str) -> str:
    """The sorted set of a job's slots (score = slot_us): under the job lease's hash tag."""
    return _job_base(namespace, job) + ":slots"


def _jobs_pattern(namespace: str) -> str:
    """SCAN pattern of every job row of ``namespace`` (never a lease key: those end with
    ``}``; never a run row or slot index: their suffix differs)."""
    prefix = _glob_escape(job_lease_name(""))
    return f"fleetcron:{{{len(namespace)}:{_glob_escape(namespace)}:{prefix}*}}:job"


def _slots_of(job_row_key: str) -> str:
    return job_row_key.removesuffix(":job") + ":slots"


def _is_lease_key(key: str) -> bool:
    """Lease keys end with the closing brace of their hash tag; ledger keys never do."""
    return key.endswith("}")


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _record(namespace: str, name: str, holder: str, reply: list[Any]) -> LeaseRecord:
    fence, acquired, expires, min_until, now = (int(_text(v)) for v in reply[:5])
    return LeaseRecord(
        namespace=namespace,
        name=name,
        holder=holder,
        fence=fence,
        acquired_us=acquired,
        expires_us=expires,
        min_until_us=min_until,
        now_us=now,
    )


def _from_get(namespace: str, reply: Any) -> LeaseRecord | None:
    if not reply:
        return None
    holder, name = _text(reply[0]), _text(reply[6])
    return _record(namespace, name, holder, reply[1:6])


def _int(value: Any) -> int | None:
    return None if value is None else int(_text(value))


def _opt(value: object) -> str:
    """An optional script argument: ``''`` is NULL, anything else is ``'=' + value``."""
    return "" if value is None else f"={value}"


def _run(namespace: str, reply: Any) -> RunRecord:
    """Map a ``run_row`` reply: ``job, slot, state, attempt, fence, holder, run_id, trigger,
    started, finished, expires, retry_at, cancel, exit_code, error, output, now``."""
    row = list(reply)
    return RunRecord(
        namespace=namespace,
        job=_text(row[0]),
        slot_us=int(_text(row[1])),
        state=_text(row[2]),
        attempt=int(_text(row[3])),
        fence=int(_text(row[4])),
        holder=_text(row[5]),
        run_id=_text(row[6]),
        trigger=_text(row[7]),
        started_us=_int(row[8]),
        finished_us=_int(row[9]),
        expires_us=_int(row[10]),
        retry_at_us=_int(row[11]),
        cancel_requested=row[12] is not None and _text(row[12]) == "1",
        exit_code=_int(row[13]),
        error=None if row[14] is None else _text(row[14]),
        output=None if row[15] is None else _text(row[15]),
        now_us=int(_text(row[16])),
    )


def _job(namespace: str, reply: Any) -> JobRecord:
    """Map a ``job_row`` reply: ``job, paused, definition, fingerprint, high_water,
    last_success, last_failure, updated, now``."""
    row = list(reply)
    return JobRecord(
        namespace=namespace,
        job=_text(row[0]),
        paused=row[1] is not None and _text(row[1]) == "1",
        definition=_text(row[2]) if row[2] is not None else "{}",
        fingerprint=_text(row[3]) if row[3] is not None else "",
        high_water_us=_int(row[4]),
        last_success_us=_int(row[5]),
        last_failure_us=_int(row[6]),
        updated_us=int(_text(row[7])),
        now_us=int(_text(row[8])),
    )


class _RedisLeases:
    """Lease operations as script invocations."""

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        reply = yield Script(
            "lease_acquire",
            (lease_key(namespace, name),),
            (holder, ttl_us, least_us, namespace, name),
        )
        if not reply:
            return None
        fence, now = int(reply[0]), int(reply[1])
        return acquired_record(namespace, name, holder, fence, now, ttl_us, least_us)

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        reply = yield Script("lease_extend", (lease_key(namespace, name),), (holder, fence, ttl_us))
        return _record(namespace, name, holder, reply) if reply else None

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        reply = yield Script("lease_release", (lease_key(namespace, name),), (holder, fence))
        return bool(reply)

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        reply = yield Script("lease_get", (lease_key(namespace, name),), ())
        return _from_get(namespace, reply)

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        keys = yield KeyScan(_namespace_pattern(namespace))
        keys = [key for key in keys if _is_lease_key(key)]
        replies = yield fan_out("lease_get", tuple(keys), ())
        records = [r for r in (_from_get(namespace, reply) for reply in replies) if r]
        return sorted(records, key=lambda record: record.name)

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        keys = yield KeyScan(_namespace_pattern(namespace))
        keys = [key for key in keys if _is_lease_key(key)]
        replies = yield fan_out("lease_prune", tuple(keys), (older_than_us, 1 if dry_run else 0))
        return sorted(_text(reply) for reply in replies if reply)


class _RedisLedger:
    """The run ledger as script invocations (docs/design/ledger.md).

    A claim batch is one :class:`~fleetcron.stores.statements.ScriptCalls`: the runner sends
    its calls in one pipeline. ``cluster``: split a batch into one call per job, so that no
    call spans two hash slots.
    """

    cluster: bool = False

    def store_now(self) -> Operation[int]:
        reply = yield Script("store_now")
        return int(_text(reply))

    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        if not claims:
            return []
        groups = self._claim_groups(claims)
        calls = tuple(
            (
                tuple(key for i in group for key in _claim_keys(namespace, claims[i])),
                (
                    holder,
                    ttl_us,
                    namespace,
                    LOST_ERROR,
                    MISSED_ERROR,
                    *(arg for i in group for arg in _claim_args(claims[i])),
                ),
            )
            for group in groups
        )
        replies = yield ScriptCalls("run_claim", calls)
        by_index: dict[int, Any] = {}
        for group, reply in zip(groups, replies, strict=True):
            by_index.update(zip(group, reply, strict=True))
        answers = []
        for i, claim in enumerate(claims):
            reply = by_index[i]
            # A refusal is its reason as a status string; a claim, the run row (a list).
            if isinstance(reply, bytes | str):
                run: RunRecord | None = None
                status = _text(reply)
            else:
                run, status = _run(namespace, reply), "claimed"
            answers.append(
                ClaimResult(job=claim.job, slot_us=claim.slot_us, status=status, run=run)
            )
        return answers

    def _claim_groups(self, claims: Sequence[SlotClaim]) -> list[list[int]]:
        """The claims (by index) each script call decides: all of them on one server (one
        TIME, one atomic step); on a Cluster, one call per job (its keys share the job
        lease's hash tag), all calls still in one pipeline, each with its own TIME."""
        if not self.cluster:
            return [list(range(len(claims)))]
        groups: dict[str, list[int]] = {}
        for index, claim in enumerate(claims):
            groups.setdefault(claim.job, []).append(index)
        return list(groups.values())

    def run_extend(
        self, namespace: str, job: str, slot_us: int, fence: int, ttl_us: int
    ) -> Operation[RunRecord | None]:
        reply = yield Script(
            "run_extend",
            (lease_key(namespace, job_lease_name(job)), run_key(namespace, job, slot_us)),
            (fence, ttl_us),
        )
        return _run(namespace, reply) if reply else None

    def run_finish(
        self, namespace: str, job: str, slot_us: int, fence: int, outcome: RunOutcome
    ) -> Operation[bool]:
        output = outcome.output[-OUTPUT_LIMIT:] if outcome.output else outcome.output
        reply = yield Script(
            "run_finish",
            (
                lease_key(namespace, job_lease_name(job)),
                job_key(namespace, job),
                run_key(namespace, job, slot_us),
            ),
            (
                fence,
                outcome.state,
                _opt(outcome.exit_code),
                _opt(outcome.error),
                _opt(output),
                _opt(outcome.retry_after_us),
                job,
            ),
        )
        return bool(reply)

    def run_record(
        self, namespace: str, job: str, slot_us: int, state: str, error: str | None, trigger: str
    ) -> Operation[bool]:
        reply = yield Script(
            "run_record",
            (
                job_key(namespace, job),
                run_key(namespace, job, slot_us),
                slots_key(namespace, job),
            ),
            (slot_us, state, _opt(error), trigger, job),
        )
        return bool(reply)

    def run_cancel(self, namespace: str, job: str) -> Operation[int]:
        reply = yield Script("run_cancel", (slots_key(namespace, job),), ())
        return int(reply)

    def run_settled(
        self, namespace: str, slots: Sequence[tuple[str, int]]
    ) -> Operation[set[tuple[str, int]]]:
        if not slots:
            return set()
        # One call per run key (any hash slot), all in one pipeline.
        keys = tuple(run_key(namespace, job, slot) for job, slot in slots)
        replies = yield fan_out("run_settled", keys, ())
        return {pair for pair, reply in zip(slots, replies, strict=True) if int(reply)}

    def run_get(self, namespace: str, job: str, slot_us: int) -> Operation[RunRecord | None]:
        reply = yield Script("run_get", (run_key(namespace, job, slot_us),), ())
        return _run(namespace, reply) if reply else None

    def run_list(self, namespace: str, job: str | None, limit: int) -> Operation[list[RunRecord]]:
        if limit <= 0:
            return []
        if job is not None:
            reply = yield Script("run_list", (slots_key(namespace, job),), (limit,))
            return [_run(namespace, row) for row in reply]
        keys = yield KeyScan(_jobs_pattern(namespace))
        replies = yield fan_out("run_list", tuple(_slots_of(key) for key in keys), (limit,))
        rows = [_run(namespace, row) for reply in replies for row in reply]
        rows.sort(key=lambda run: (-run.slot_us, run.job))
        return rows[:limit]

    def run_due(
        self, namespace: str, limit: int, jobs: Sequence[str] | None = None
    ) -> Operation[list[RunRecord]]:
        if limit <= 0 or (jobs is not None and not jobs):
            return []
        if jobs is None:
            found = yield KeyScan(_jobs_pattern(namespace))
            slot_keys = tuple(_slots_of(key) for key in found)
        else:  # the named jobs' slot indexes: no scan
            slot_keys = tuple(slots_key(namespace, job) for job in jobs)
        replies = yield fan_out("run_due", slot_keys, (limit,))
        rows = [_run(namespace, row) for reply in replies for row in reply]
        rows.sort(key=lambda run: (run.slot_us, run.job))
        return rows[:limit]

    def run_prune(self, namespace: str, keep: int, older_than_us: int) -> Operation[int]:
        keys = yield KeyScan(_jobs_pattern(namespace))
        replies = yield fan_out(
            "run_prune", tuple(_slots_of(key) for key in keys), (max(keep, 0), older_than_us)
        )
        return sum(int(reply) for reply in replies)

    def job_register(
        self, namespace: str, jobs: Sequence[tuple[str, str, str]]
    ) -> Operation[list[JobRecord | None]]:
        if not jobs:
            return []
        # One script call per job (each on its own key), all in one pipeline.
        calls = tuple(
            ((job_key(namespace, job),), (job, definition, fingerprint))
            for job, definition, fingerprint in jobs
        )
        replies = yield ScriptCalls("job_register", calls)
        return [_job(namespace, reply) if reply else None for reply in replies]

    def job_set_paused(self, namespace: str, job: str, paused: bool) -> Operation[bool]:
        reply = yield Script("job_set_paused", (job_key(namespace, job),), (1 if paused else 0,))
        return bool(reply)

    def job_get(self, namespace: str, job: str) -> Operation[JobRecord | None]:
        reply = yield Script("job_get", (job_key(namespace, job),), ())
        return _job(namespace, reply) if reply else None

    def job_list(self, namespace: str) -> Operation[list[JobRecord]]:
        keys = yield KeyScan(_jobs_pattern(namespace))
        replies = yield fan_out("job_get", tuple(keys), ())
        jobs = [_job(namespace, reply) for reply in replies if reply]
        return sorted(jobs, key=lambda row: row.job)


class RedisOperations(_RedisLeases, _RedisLedger):
    """Every operation of the Redis store: leases and the run ledger."""

    def __init__(self, *, cluster: bool = False) -> None:
        self.cluster = cluster


def _claim_keys(namespace: str, claim: SlotClaim) -> tuple[str, str, str, str]:
    return (
        lease_key(namespace, job_lease_name(claim.job)),
        job_key(namespace, claim.job),
        run_key(namespace, claim.job, claim.slot_us),
        slots_key(namespace, claim.job),
    )


def _claim_args(claim: SlotClaim) -> tuple[ScriptArg, ...]:
    return (
        claim.slot_us,
        claim.run_id,
        1 if claim.exclusive else 0,
        claim.max_attempts,
        claim.trigger,
        claim.least_us,
        claim.job,
        job_lease_name(claim.job),
        _opt(claim.deadline_us),
    )


def translate(exc: BaseException) -> FleetcronError | None:
    """Map a redis-py exception to fleetcron's hierarchy."""
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return ConfigurationError(
            "the Redis server is a read-only replica; point the backend URL at the primary"
        )
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        return StoreError(f"Redis refused the credentials or command: {exc}")
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return StoreUnavailable(f"Redis unreachable: {exc}")
    if isinstance(exc, redis.exceptions.RedisError):
        return StoreError(f"Redis error: {exc}")
    return None


Call = tuple[tuple[str, ...], tuple[ScriptArg, ...]]


def _not_redis(statement: Statement) -> TypeError:
    return TypeError(f"the Redis store cannot run {statement!r}")


def _collect(pending: list[int], replies: list[Any], results: list[Any]) -> list[int]:
    """Store each reply of a pipeline in ``results``; return the calls the server did not
    run because it did not know the script (``NOSCRIPT``), to run again after loading it.
    Any other error is raised."""
    missing = []
    for index, reply in zip(pending, replies, strict=True):
        if isinstance(reply, redis.exceptions.NoScriptError):
            missing.append(index)
        elif isinstance(reply, Exception):
            raise reply
        else:
            results[index] = reply
    return missing


_SCRIPT_LOAD_TRIES = 3


def _client_kwargs(url: StoreURL) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": 10,
        "socket_timeout": 30,
        "health_check_interval": 0,
    }
    if not url.raw.startswith("unix://"):  # TCP keepalive has no meaning on a unix socket
        kwargs["socket_keepalive"] = True
    return kwargs


def _warn_about_config(url: str, policy: str | None, role: str | None) -> None:
    if role and role not in ("master", "primary"):
        raise ConfigurationError(f"{url} is a Redis {role}, not a primary; point at the primary")
    if policy and policy.startswith("allkeys-"):
        log.warning(
            "Redis maxmemory-policy is %s: lease hashes can be evicted under memory "
            "pressure (fences stay monotonic; a lease may be lost early)",
            policy,
            extra={"action": "store_warning", "store": url},
        )


class RedisStore:
    """Sync Redis store."""

    capabilities = Capability.CROSS_HOST | Capability.SERVER_CLOCK

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = RedisOperations()
        self._lock = threading.Lock()
        self._client: redis.Redis = redis.Redis.from_url(url.raw, **_client_kwargs(url))
        self._scripts: dict[str, RedisScript] = {
            name: self._client.register_script(text) for name, text in SCRIPTS.items()
        }
        try:
            role = self._client.execute_command("ROLE")[0]  # type: ignore[no-untyped-call]
            policy = self._config_get("maxmemory-policy")
        except redis.exceptions.RedisError as exc:
            self._client.close()
            error = translate(exc)
            assert error is not None
            raise StoreUnavailable(f"cannot connect to {self.url}: {error.message}") from exc
        _warn_about_config(self.url, policy, _text(role))

    def _config_get(self, key: str) -> str | None:
        try:
            reply = self._client.config_get(key)
        except redis.exceptions.ResponseError:  # CONFIG may be disabled (managed Redis)
            return None
        value = reply.get(key) if isinstance(reply, dict) else None
        return _text(value) if value is not None else None

    def _execute(self, statement: Statement) -> Any:
        match statement:
            case KeyScan(pattern):
                return [_text(k) for k in self._client.scan_iter(match=pattern)]
            case ScriptCalls(name, calls):
                return self._pipeline(self._scripts[name], list(calls))
            case Script(name, keys, args):
                return self._scripts[name](keys=list(keys), args=list(args))
            case _:
                raise _not_redis(statement)

    def _pipeline(self, script: RedisScript, calls: list[Call]) -> list[Any]:
        """Run every call of ``script`` in one pipeline: one round trip (``EVALSHA``; the
        script is loaded and the refused calls re-sent only after a script cache flush)."""
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(_SCRIPT_LOAD_TRIES):
            if not pending:
                break
            with self._client.pipeline(transaction=False) as pipe:
                for index in pending:
                    keys, argv = calls[index]
                    pipe.evalsha(script.sha, len(keys), *keys, *argv)
                replies = pipe.execute(raise_on_error=False)
            pending = _collect(pending, replies, results)
            if pending:
                script.sha = self._client.script_load(script.script)
        if pending:
            raise redis.exceptions.NoScriptError("the script cache keeps being flushed")
        return results

    def _guarded(self, statement: Statement) -> Any:
        try:
            return self._execute(statement)
        except redis.exceptions.RedisError as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc

    def run(self, operation: Operation[T]) -> T:
        with self._lock:
            return drive(operation, self._guarded)

    def migrate(self) -> list[str]:
        """Redis keeps no schema; nothing to apply."""
        return []

    def close(self) -> None:
        self._client.close()


class AsyncRedisStore:
    """Async Redis store (``redis.asyncio``)."""

    capabilities = RedisStore.capabilities

    def __init__(self, url: StoreURL) -> None:
        self.url = url.redacted
        self.ops = RedisOperations()
        self._client: aioredis.Redis = aioredis.Redis.from_url(url.raw, **_client_kwargs(url))
        self._scripts: dict[str, AsyncScript] = {
            name: self._client.register_script(text) for name, text in SCRIPTS.items()
        }

    async def open(self) -> None:
        try:
            role = (await self._client.execute_command("ROLE"))[0]  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisError as exc:
            await self._client.aclose()
            raise StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc
        _warn_about_config(self.url, None, _text(role))

    async def _execute(self, statement: Statement) -> Any:
        try:
            match statement:
                case KeyScan(pattern):
                    return [_text(k) async for k in self._client.scan_iter(match=pattern)]
                case ScriptCalls(name, calls):
                    return await self._pipeline(self._scripts[name], list(calls))
                case Script(name, keys, args):
                    return await self._scripts[name](keys=list(keys), args=list(args))
                case _:
                    raise _not_redis(statement)
        except redis.exceptions.RedisError as exc:
            error = translate(exc)
            assert error is not None
            raise error from exc

    async def _pipeline(self, script: AsyncScript, calls: list[Call]) -> list[Any]:
        """Async twin of :meth:`RedisStore._pipeline`."""
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(_SCRIPT_LOAD_TRIES):
            if not pending:
                break
            async with self._client.pipeline(transaction=False) as pipe:
                for index in pending:
                    keys, argv = calls[index]
                    pipe.evalsha(script.sha, len(keys), *keys, *argv)
                replies = await pipe.execute(raise_on_error=False)
            pending = _collect(pending, replies, results)
            if pending:
                script.sha = await self._client.script_load(script.script)
        if pending:
            raise redis.exceptions.NoScriptError("the script cache keeps being flushed")
        return results

    async def run(self, operation: Operation[T]) -> T:
        return await drive_async(operation, self._execute)

    async def migrate(self) -> list[str]:
        return []

    async def close(self) -> None:
        await self._client.aclose()
