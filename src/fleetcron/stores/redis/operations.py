"""The Redis store's keys and operations: one Lua script call per operation, so each is
one round trip (the scripts are ``scripts.lua``; the runner is :mod:`.store`).

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
namespace are found by SCAN of ``…:fleetcron:job:*}:job``, and its runs by SCAN of
``…:fleetcron:job:*}:slots`` — so the runs that ``job_delete`` leaves (it removes the job
row, never a run) are still listed and pruned (no per-namespace index: it would be another
Cluster slot). The scripts of a whole job (``run_list``, ``run_cancel``,
``run_prune``, ``run_prune_job``, ``job_delete``) are given the slot index as their key and
reach the run rows named in it; those rows share its hash tag, so they are in the same slot.

Replica heartbeats (docs/design/replicas.md) live under one hash tag per namespace, that
of the name ``fleetcron:replicas``; with ``R = fleetcron:{<len(ns)>:<ns>:fleetcron:replicas}``:

- ``R:index`` — sorted set of the namespace's replicas (member the replica id, score its
  ``expires_us``), to list and prune them in one script;
- ``R:replica:<replica_id>`` — one replica's row: ``id``, ``host``, ``pid``, ``version``,
  ``mode``, ``jobs``, ``started``, ``seen``, ``expiry`` (no ``expires`` or ``fence`` field, so
  the lease scripts take it for no lease whatever its id). It has a TTL (``PEXPIRE``) of
  ``ttl + retain``, refreshed by every beat, so a replica gone for good leaves nothing
  behind even if no other replica beats again; the index key gets at least the same.

Neither ends with ``}`` nor matches the job-row pattern, so the lease and ledger SCANs never
see them. Nor do the work queue's keys (:mod:`.queue`), under the hash tag of the name
``fleetcron:queue:<queue>``.

Checkpoints (``ctx.checkpoint``, :mod:`.checkpoints`) are one hash each, under the hash tag
of the name ``fleetcron:checkpoint:<name>``; with
``C = fleetcron:{<len(ns)>:<ns>:fleetcron:checkpoint:<name>}``:

- ``C:checkpoint`` — ``value`` (the text as set, byte for byte), ``fence``, ``updated``;
  no TTL.

It ends with ``}:checkpoint``: not with ``}`` (the lease SCAN's test), nor with ``}:job``,
``}:slots`` or ``}:ids`` (the ledger and queue SCAN patterns), so no SCAN takes it for one
of theirs.

A batch of claims is one round trip (plus one ``SCRIPT LOAD`` after a script cache
flush): a pipeline of ``EVALSHA`` calls of the claim script, each with its own keys and
arguments. On one server the whole batch is one call — one ``TIME``, one atomic step.
``RedisOperations(cluster=True)`` splits it into one call per job (each
call's keys share one hash tag), all in the same pipeline; each call then has its own
``TIME``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from fleetcron.models import (
    REPLICA_RETAIN_US,
    ClaimResult,
    JobRecord,
    LeaseRecord,
    ReplicaInfo,
    ReplicaRecord,
    RunFinish,
    RunNote,
    RunOutcome,
    RunRecord,
    SlotClaim,
    job_lease_name,
)
from fleetcron.stores.base import REPLICA_PRUNE_LIMIT, Operation, as_text
from fleetcron.stores.ledger import LOST_ERROR, MISSED_ERROR, backfill_slots, stored_text
from fleetcron.stores.redis.checkpoints import RedisCheckpoints
from fleetcron.stores.redis.keys import (
    all_jobs_pattern,
    is_lease_key,
    job_key,
    job_name,
    job_namespace,
    jobs_pattern,
    lease_key,
    namespace_pattern,
    replica_index_key,
    replica_key,
    run_key,
    slots_key,
    slots_pattern,
)
from fleetcron.stores.redis.queue import RedisQueue
from fleetcron.stores.redis.replies import (
    acquired_of,
    job_of,
    lease_of,
    replica_of,
    replicas_of,
    run_of,
    runs_of,
)
from fleetcron.stores.redis.statements import KeyScan, Script, ScriptArg, ScriptCalls, fan_out

__all__ = ["RedisOperations"]


def _opt(value: object) -> str:
    """An optional script argument: ``''`` is NULL, anything else is ``'=' + value``."""
    return "" if value is None else f"={value}"


def _finish_call(
    namespace: str, finish: RunFinish
) -> tuple[tuple[str, ...], tuple[ScriptArg, ...]]:
    """The keys and arguments of one ``run_finish`` script call."""
    outcome = finish.outcome
    output = stored_text(outcome.output, tail=True)
    keys = (
        lease_key(namespace, job_lease_name(finish.job)),
        job_key(namespace, finish.job),
        run_key(namespace, finish.job, finish.slot_us),
    )
    args = (
        finish.fence,
        outcome.state,
        _opt(outcome.exit_code),
        _opt(stored_text(outcome.error)),
        _opt(output),
        _opt(outcome.retry_after_us),
        finish.job,
    )
    return keys, args


def _record_call(namespace: str, note: RunNote) -> tuple[tuple[str, ...], tuple[ScriptArg, ...]]:
    """The keys and arguments of one ``run_record`` script call."""
    keys = (
        job_key(namespace, note.job),
        run_key(namespace, note.job, note.slot_us),
        slots_key(namespace, note.job),
    )
    return keys, (note.slot_us, note.state, _opt(note.error), note.trigger, note.job)


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
        return acquired_of(namespace, name, holder, ttl_us, least_us, reply)

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        reply = yield Script("lease_extend", (lease_key(namespace, name),), (holder, fence, ttl_us))
        return lease_of(namespace, reply)

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        reply = yield Script("lease_release", (lease_key(namespace, name),), (holder, fence))
        return bool(reply)

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        reply = yield Script("lease_get", (lease_key(namespace, name),), ())
        return lease_of(namespace, reply)

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        keys = yield KeyScan(namespace_pattern(namespace))
        keys = [key for key in keys if is_lease_key(key)]
        replies = yield fan_out("lease_get", tuple(keys), ())
        records = [r for r in (lease_of(namespace, reply) for reply in replies) if r]
        return sorted(records, key=lambda record: record.name)

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        keys = yield KeyScan(namespace_pattern(namespace))
        keys = [key for key in keys if is_lease_key(key)]
        replies = yield fan_out("lease_prune", tuple(keys), (older_than_us, 1 if dry_run else 0))
        return sorted(as_text(reply) for reply in replies if reply)


class _RedisLedger:
    """The run ledger as script invocations (docs/design/ledger.md).

    A claim batch is one :class:`~fleetcron.stores.statements.ScriptCalls`: the runner sends
    its calls in one pipeline. ``cluster``: split a batch into one call per job, so that no
    call spans two hash slots.
    """

    cluster: bool = False

    def store_now(self) -> Operation[int]:
        reply = yield Script("store_now")
        return int(reply)

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
                    *_claim_fingerprints([claims[i] for i in group]),
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
            # A refusal is its reason as a status string (a conflict's is followed by the
            # registered fingerprint: 'conflict:<fingerprint>'); a claim, the run row (a list).
            run: RunRecord | None = None
            stored: str | None = None
            if isinstance(reply, bytes | str):
                status, _, fingerprint = as_text(reply).partition(":")
                stored = fingerprint if status == "conflict" else None
            else:
                run, status = run_of(namespace, reply), "claimed"
            answers.append(
                ClaimResult(
                    job=claim.job,
                    slot_us=claim.slot_us,
                    status=status,
                    run=run,
                    stored_fingerprint=stored,
                )
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
        return run_of(namespace, reply) if reply else None

    def run_finish(
        self, namespace: str, job: str, slot_us: int, fence: int, outcome: RunOutcome
    ) -> Operation[bool]:
        keys, args = _finish_call(namespace, RunFinish(job, slot_us, fence, outcome))
        reply = yield Script("run_finish", keys, args)
        return bool(reply)

    def run_finish_many(
        self, namespace: str, finishes: Sequence[RunFinish]
    ) -> Operation[list[bool]]:
        if not finishes:
            return []
        # One call per finish (its keys share the job's hash tag), all in one pipeline.
        calls = tuple(_finish_call(namespace, finish) for finish in finishes)
        replies = yield ScriptCalls("run_finish", calls)
        return [bool(reply) for reply in replies]

    def run_record(
        self, namespace: str, job: str, slot_us: int, state: str, error: str | None, trigger: str
    ) -> Operation[bool]:
        keys, args = _record_call(namespace, RunNote(job, slot_us, state, error, trigger))
        reply = yield Script("run_record", keys, args)
        return bool(reply)

    def run_record_many(self, namespace: str, notes: Sequence[RunNote]) -> Operation[list[bool]]:
        if not notes:
            return []
        # One call per note (its keys share the job's hash tag), all in one pipeline.
        calls = tuple(_record_call(namespace, note) for note in notes)
        replies = yield ScriptCalls("run_record", calls)
        return [bool(reply) for reply in replies]

    def run_backfill(self, namespace: str, job: str, slots: Sequence[int]) -> Operation[int]:
        if not slots:
            return 0
        # One script call: a script is one atomic step, and every key it writes shares the
        # hash tag of its slot index (one Cluster slot).
        reply = yield Script(
            "run_backfill", (slots_key(namespace, job),), (job, *backfill_slots(slots))
        )
        return int(reply)

    def run_cancel(
        self, namespace: str, job: str, slot_us: int | None = None, note: str | None = None
    ) -> Operation[int]:
        args = (_opt(slot_us), _opt(stored_text(note)))
        reply = yield Script("run_cancel", (slots_key(namespace, job),), args)
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
        return run_of(namespace, reply) if reply else None

    def run_list(self, namespace: str, job: str | None, limit: int) -> Operation[list[RunRecord]]:
        if limit <= 0:
            return []
        if job is not None:
            reply = yield Script("run_list", (slots_key(namespace, job),), (limit,))
            return runs_of(namespace, reply)
        keys = yield KeyScan(slots_pattern(namespace))
        replies = yield fan_out("run_list", tuple(keys), (limit,))
        rows = runs_of(namespace, chain.from_iterable(replies))
        rows.sort(key=lambda run: (-run.slot_us, run.job))
        return rows[:limit]

    def run_list_many(
        self, namespace: str, jobs: Sequence[str], limit: int, *, output: bool = True
    ) -> Operation[list[list[RunRecord]]]:
        if not jobs or limit <= 0:
            return [[] for _ in jobs]
        # One call per job's slot index, all in one pipeline.
        keys = tuple(slots_key(namespace, job) for job in jobs)
        replies = yield fan_out("run_list", keys, (limit, int(output)))
        return [runs_of(namespace, reply) for reply in replies]

    def run_running(
        self, namespace: str, jobs: Sequence[str], limit: int
    ) -> Operation[list[RunRecord]]:
        if not jobs or limit <= 0:
            return []
        # No index of the running rows here: one call per job's slot index, all in one
        # pipeline, each reading the state of its newest rows and sending back the
        # running ones only.
        keys = tuple(slots_key(namespace, job) for job in sorted(jobs))
        replies = yield fan_out("run_running", keys, (limit,))
        return runs_of(namespace, chain.from_iterable(replies))

    def run_due(
        self, namespace: str, limit: int, jobs: Sequence[str] | None = None
    ) -> Operation[list[RunRecord]]:
        if limit <= 0 or (jobs is not None and not jobs):
            return []
        if jobs is None:
            found = yield KeyScan(slots_pattern(namespace))
            slot_keys = tuple(found)
        else:  # the named jobs' slot indexes: no scan
            slot_keys = tuple(slots_key(namespace, job) for job in jobs)
        replies = yield fan_out("run_due", slot_keys, (limit,))
        rows = runs_of(namespace, chain.from_iterable(replies))
        rows.sort(key=lambda run: (run.slot_us, run.job))
        return rows[:limit]

    def run_prune(self, namespace: str, keep: int, older_than_us: int) -> Operation[int]:
        keys = yield KeyScan(slots_pattern(namespace))
        replies = yield fan_out("run_prune", tuple(keys), (max(keep, 0), older_than_us))
        return sum(int(reply) for reply in replies)

    def run_prune_job(
        self,
        namespace: str,
        job: str,
        keep: int,
        older_than_us: int,
        limit: int,
        dry_run: bool = False,
    ) -> Operation[int]:
        if limit <= 0:
            return 0
        reply = yield Script(
            "run_prune_job",
            (slots_key(namespace, job),),
            (max(keep, 0), older_than_us, limit, 1 if dry_run else 0),
        )
        return int(reply)

    def run_prune_jobs(
        self, namespace: str, rules: Sequence[tuple[str, int, int]], limit: int
    ) -> Operation[list[int]]:
        if limit <= 0 or not rules:
            return [0] * len(rules)
        # One call per job (its own hash slot), all in one pipeline.
        calls = tuple(
            ((slots_key(namespace, job),), (max(keep, 0), older_than_us, limit, 0))
            for job, keep, older_than_us in rules
        )
        replies = yield ScriptCalls("run_prune_job", calls)
        return [int(reply) for reply in replies]

    def job_delete(self, namespace: str, job: str, dry_run: bool = False) -> Operation[bool]:
        reply = yield Script(
            "job_delete",
            (slots_key(namespace, job), job_key(namespace, job)),
            (1 if dry_run else 0,),
        )
        return bool(reply)

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
        return [job_of(namespace, reply) for reply in replies]

    def job_set_paused(self, namespace: str, job: str, paused: bool) -> Operation[bool]:
        reply = yield Script(
            "job_set_paused",
            (job_key(namespace, job), slots_key(namespace, job)),
            (1 if paused else 0, job),
        )
        return bool(reply)

    def job_get(self, namespace: str, job: str) -> Operation[JobRecord | None]:
        reply = yield Script("job_get", (job_key(namespace, job),), ())
        return job_of(namespace, reply)

    def job_list(self, namespace: str) -> Operation[list[JobRecord]]:
        keys = yield KeyScan(jobs_pattern(namespace))
        replies = yield fan_out("job_get", tuple(keys), ())
        jobs = [job for job in (job_of(namespace, reply) for reply in replies) if job]
        return sorted(jobs, key=lambda row: row.job)

    def job_page(
        self, namespace: str, after: str, limit: int, *, definitions: bool = True
    ) -> Operation[list[JobRecord]]:
        if limit <= 0:
            return []
        # The names come from the keys (a SCAN of names only); the rows of the page's alone.
        keys = yield KeyScan(jobs_pattern(namespace))
        names = sorted(
            job for job in (job_name(namespace, key) for key in keys) if job and job > after
        )
        page = tuple(job_key(namespace, job) for job in names[:limit])
        if not page:
            return []
        replies = yield fan_out("job_get" if definitions else "job_get_brief", page, ())
        # A row deleted between the scan and the read is not there.
        return [job for job in (job_of(namespace, reply) for reply in replies) if job]

    def job_namespaces(self) -> Operation[list[str]]:
        keys = yield KeyScan(all_jobs_pattern())
        found = (job_namespace(key) for key in keys)
        return sorted({namespace for namespace in found if namespace is not None})


class _RedisReplicas:
    """Replica heartbeats as script invocations, one script (one hash slot) each."""

    def replica_beat(
        self,
        namespace: str,
        replica: ReplicaInfo,
        ttl_us: int,
        retain_us: int = REPLICA_RETAIN_US,
    ) -> Operation[ReplicaRecord]:
        reply = yield Script(
            "replica_beat",
            (replica_index_key(namespace), replica_key(namespace, replica.replica_id)),
            (
                replica.replica_id,
                replica.host,
                replica.pid,
                replica.version,
                replica.mode,
                replica.jobs_fingerprint,
                ttl_us,
                retain_us,
                REPLICA_PRUNE_LIMIT,
            ),
        )
        return replica_of(namespace, reply)

    def replica_list(
        self, namespace: str, gone_within_us: int = REPLICA_RETAIN_US
    ) -> Operation[list[ReplicaRecord]]:
        reply = yield Script("replica_list", (replica_index_key(namespace),), (gone_within_us,))
        rows = replicas_of(namespace, reply)
        return sorted(rows, key=lambda row: row.replica_id)

    def replica_leave(self, namespace: str, replica_id: str) -> Operation[bool]:
        reply = yield Script(
            "replica_leave",
            (replica_index_key(namespace), replica_key(namespace, replica_id)),
            (replica_id,),
        )
        return bool(reply)


class RedisOperations(_RedisLeases, _RedisLedger, _RedisReplicas, RedisQueue, RedisCheckpoints):
    """Every operation of the Redis store: leases, the run ledger, replica heartbeats, the
    work queue (:mod:`.queue`) and checkpoints (:mod:`.checkpoints`)."""

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
        1 if claim.moves_progress else 0,
        1 if claim.pausable else 0,
    )


def _claim_fingerprints(claims: Sequence[SlotClaim]) -> tuple[ScriptArg, ...]:
    """The claimers' fingerprints, one per claim after every claim's arguments — only when
    a claim carries one (``fleetcron exec`` claims never do)."""
    if all(claim.fingerprint is None for claim in claims):
        return ()
    return tuple(_opt(claim.fingerprint) for claim in claims)
