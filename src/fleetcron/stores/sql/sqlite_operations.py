"""SQLite's operations: the shared SQL lease statements, work queue and checkpoints, and
the run ledger applied in Python (stores/ledger.py) to rows read and written inside one
``BEGIN IMMEDIATE`` transaction — SQLite is in-process, so several statements cost no
round trips.

A lease taken here records its holder's process (:mod:`fleetcron.local_holder`), and an
acquire that finds the lease held by a holder gone from this host releases it on its
behalf and takes it, in the same transaction (:meth:`SqliteOperations.lease_acquire`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from typing import Any

from fleetcron._log import log
from fleetcron.local_holder import LocalHolder, Locality, host_locality
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
from fleetcron.stores.base import Operation, conflict_answer
from fleetcron.stores.ledger import (
    decide_claim,
    decide_extend,
    decide_finish,
    new_job,
    noted_run,
)
from fleetcron.stores.rows import ACQUIRED, JOBS, LEASES, REPLICAS, RUNS, RowDecoder, position
from fleetcron.stores.sql.checkpoints import SqlCheckpoints
from fleetcron.stores.sql.operations import (
    SqlLedger,
    SqlOperations,
    backfill_params,
    cancel_params,
    prune_job_params,
    replica_params,
)
from fleetcron.stores.sql.queue import SqlQueue
from fleetcron.stores.sql.statements import Query, SqlResult

__all__ = ["SqliteOperations"]


class SqliteOperations(SqlOperations, SqlLedger, SqlQueue, SqlCheckpoints):
    """Every operation of the SQLite store. The store runs each one in one transaction.

    ``locality``: what this host knows of its processes (default :func:`host_locality`:
    Linux's ``/proc``; elsewhere nothing is recorded and nothing taken over)."""

    def __init__(self, locality: Locality | None = None) -> None:
        super().__init__()
        self.locality = locality if locality is not None else host_locality()

    # -- leases: the holder's process, and its takeover -----------------------------------
    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        """Take the lease if it is free, or if its holder is gone from this host (see
        :mod:`fleetcron.local_holder`): then it is released on that holder's behalf —
        free at once, or at its ``min_until`` — and taken with the next fence, in this one
        transaction, so two contenders never both take it."""
        me = self.locality.holder()
        params = {
            "namespace": namespace,
            "name": name,
            "holder": holder,
            "ttl_us": ttl_us,
            "least_us": least_us,
            "scope": None if me is None else me.scope,
            "pid": None if me is None else me.pid,
            "start": None if me is None else me.start,
            "group": None if me is None else me.group,
        }
        result: SqlResult = yield Query("lease_acquire", params)
        if not result.rows and me is not None:
            released = yield from self._release_if_gone(namespace, name, me.scope)
            if released:
                result = yield Query("lease_acquire", params)
        return ACQUIRED.first(result, namespace, name, holder, ttl_us, least_us)

    def _release_if_gone(self, namespace: str, name: str, scope: str) -> Operation[bool]:
        """Release the held lease ``name`` for its holder if that holder is gone from this
        host; whether it was."""
        found: SqlResult = yield Query(
            "lease_holder", {"namespace": namespace, "name": name, "scope": scope}
        )
        row = _HOLDERS.first(found, scope)
        if row is None:
            return False
        holder, fence, process = row
        if not self.locality.gone(process):
            return False
        released: SqlResult = yield Query(
            "lease_release",
            {"namespace": namespace, "name": name, "holder": holder, "fence": fence},
        )
        if not released.rows:
            return False
        log.warning(
            "lock %s: its holder %s (pid %d, fence %d) is gone from this host; released "
            "on its behalf",
            name,
            ":".join(holder.split(":", 2)[:2]),  # host:pid; what follows is the holder's secret
            process.pid,
            fence,
            extra={
                "action": "lease_holder_gone",
                "lock": name,
                "namespace": namespace,
                "fence": fence,
                "holder_pid": process.pid,
            },
        )
        return True

    def lease_group(
        self, namespace: str, name: str, holder: str, fence: int, group: int
    ) -> Operation[bool]:
        """Name the process group the work of the lease held by ``(holder, fence)`` runs
        in (:data:`~fleetcron.local_holder.PENDING_GROUP`: one being started): its holder
        is gone only once that group is too. ``False`` when the row is no longer that
        holder's, or does not record its process."""
        result: SqlResult = yield Query(
            "lease_group",
            {
                "namespace": namespace,
                "name": name,
                "holder": holder,
                "fence": fence,
                "group": group,
            },
        )
        return bool(result.rows)

    # -- reading and writing rows (inside the operation's transaction) ---------------
    def _now(self) -> Operation[int]:
        result: SqlResult = yield Query("store_now")
        return int(result.rows[0][0])

    def _run(self, namespace: str, job: str, slot_us: int, now: int) -> Operation[RunRecord | None]:
        result: SqlResult = yield Query(
            "run_row", {"namespace": namespace, "job": job, "slot_us": slot_us, "now": now}
        )
        return RUNS.first(result, namespace)

    def _lease(self, namespace: str, name: str, now: int) -> Operation[LeaseRecord | None]:
        result: SqlResult = yield Query(
            "lease_row", {"namespace": namespace, "name": name, "now": now}
        )
        return LEASES.first(result, namespace)

    def _job(self, namespace: str, job: str, now: int) -> Operation[JobRecord | None]:
        result: SqlResult = yield Query("job_row", {"namespace": namespace, "job": job, "now": now})
        return JOBS.first(result, namespace)

    @staticmethod
    def _put_run(run: RunRecord) -> Query:
        return Query("run_put", _stored(run))

    @staticmethod
    def _put_lease(lease: LeaseRecord) -> Query:
        return Query("lease_put", _stored(lease))

    @staticmethod
    def _put_job(job: JobRecord) -> Query:
        return Query("job_put", _stored(job))

    def _raise_high_water(
        self, namespace: str, job: str, slot_us: int, now: int
    ) -> Operation[None]:
        row = yield from self._job(namespace, job, now)
        row = row if row is not None else new_job(namespace, job, now)
        if row.high_water_us is None or slot_us > row.high_water_us:
            row = replace(row, high_water_us=slot_us)
        yield self._put_job(row)

    # -- the ledger ----------------------------------------------------------------------
    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        now = yield from self._now()
        answers = []
        for claim in claims:
            lease_name = job_lease_name(claim.job)
            job = yield from self._job(namespace, claim.job, now)
            conflict = conflict_answer(claim, job, now)
            if conflict is not None:
                answers.append(conflict)
                continue
            run = yield from self._run(namespace, claim.job, claim.slot_us, now)
            lease = yield from self._lease(namespace, lease_name, now)
            decision = decide_claim(
                namespace=namespace,
                claim=claim,
                holder=holder,
                ttl_us=ttl_us,
                now=now,
                run=run,
                lease=lease,
                job=job,
            )
            if decision.closed is not None:
                yield self._put_run(decision.closed)
                if decision.status == "missed" and claim.moves_progress:
                    yield from self._raise_high_water(namespace, claim.job, claim.slot_us, now)
            answers.append(
                ClaimResult(
                    job=claim.job, slot_us=claim.slot_us, status=decision.status, run=decision.run
                )
            )
            if decision.run is None or decision.lease is None:
                continue
            new_lease = replace(decision.lease, name=lease_name)
            yield self._put_lease(new_lease)
            yield self._put_run(decision.run)
            if claim.moves_progress:
                yield from self._raise_high_water(namespace, claim.job, claim.slot_us, now)
        return answers

    def run_extend(
        self, namespace: str, job: str, slot_us: int, fence: int, ttl_us: int
    ) -> Operation[RunRecord | None]:
        now = yield from self._now()
        run = yield from self._run(namespace, job, slot_us, now)
        lease = yield from self._lease(namespace, job_lease_name(job), now)
        renewed, new_lease = decide_extend(
            run=run, lease=lease, fence=fence, ttl_us=ttl_us, now=now
        )
        if renewed is not None:
            yield self._put_run(renewed)
        if new_lease is not None:
            yield self._put_lease(new_lease)
        return renewed

    def run_finish(
        self, namespace: str, job: str, slot_us: int, fence: int, outcome: RunOutcome
    ) -> Operation[bool]:
        (accepted,) = yield from self.run_finish_many(
            namespace, [RunFinish(job, slot_us, fence, outcome)]
        )
        return accepted

    def run_finish_many(
        self, namespace: str, finishes: Sequence[RunFinish]
    ) -> Operation[list[bool]]:
        # The whole operation is one BEGIN IMMEDIATE transaction: one commit (one sync to
        # disk) for the batch.
        now = yield from self._now()
        answers = []
        for finish in finishes:
            # Not a comprehension: `yield` is not allowed in one.
            answers.append((yield from self._finish(namespace, finish, now)))  # noqa: PERF401
        return answers

    def _finish(self, namespace: str, finish: RunFinish, now: int) -> Operation[bool]:
        job = finish.job
        run = yield from self._run(namespace, job, finish.slot_us, now)
        lease = yield from self._lease(namespace, job_lease_name(job), now)
        job_row = yield from self._job(namespace, job, now)
        finished, released, updated = decide_finish(
            run=run, lease=lease, job=job_row, fence=finish.fence, outcome=finish.outcome, now=now
        )
        if finished is None:
            return False
        yield self._put_run(finished)
        if released is not None:
            yield self._put_lease(released)
        if updated is not None:
            yield self._put_job(updated)
        return True

    def run_record(
        self,
        namespace: str,
        job: str,
        slot_us: int,
        state: str,
        error: str | None,
        trigger: str,
    ) -> Operation[bool]:
        (recorded,) = yield from self.run_record_many(
            namespace, [RunNote(job, slot_us, state, error, trigger)]
        )
        return recorded

    def run_record_many(self, namespace: str, notes: Sequence[RunNote]) -> Operation[list[bool]]:
        # One BEGIN IMMEDIATE transaction, one commit, for the batch (as run_finish_many).
        if not notes:
            return []
        now = yield from self._now()
        answers = []
        for note in notes:
            answers.append((yield from self._record(namespace, note, now)))  # noqa: PERF401
        return answers

    def _record(self, namespace: str, note: RunNote, now: int) -> Operation[bool]:
        if note.slot_us > now:  # never a row for a slot the store's clock has not reached
            return False
        existing = yield from self._run(namespace, note.job, note.slot_us, now)
        if existing is not None:
            return False
        yield self._put_run(noted_run(namespace, note, now))
        if note.state != "queued":  # a manual run is not schedule progress
            yield from self._raise_high_water(namespace, note.job, note.slot_us, now)
        return True

    def run_backfill(self, namespace: str, job: str, slots: Sequence[int]) -> Operation[int]:
        if not slots:
            return 0
        now = yield from self._now()
        params = {**backfill_params(namespace, job, slots), "now": now}
        result: SqlResult = yield Query("run_backfill", params)
        return result.rowcount  # the rows inserted: a slot that has one is passed over

    def run_cancel(
        self, namespace: str, job: str, slot_us: int | None = None, note: str | None = None
    ) -> Operation[int]:
        result: SqlResult = yield Query("run_cancel", cancel_params(namespace, job, slot_us, note))
        return len(result.rows)

    def run_prune(self, namespace: str, keep: int, older_than_us: int) -> Operation[int]:
        result: SqlResult = yield Query(
            "run_prune", {"namespace": namespace, "keep": keep, "older_than_us": older_than_us}
        )
        return len(result.rows)

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
        params = prune_job_params(namespace, job, keep, older_than_us, limit)
        if dry_run:
            preview: SqlResult = yield Query("run_prune_job_preview", params)
            return int(preview.rows[0][0])
        result: SqlResult = yield Query("run_prune_job", params)
        return len(result.rows)  # one row (RETURNING 1) per deleted row

    def run_prune_jobs(
        self, namespace: str, rules: Sequence[tuple[str, int, int]], limit: int
    ) -> Operation[list[int]]:
        counts = []
        for job, keep, older_than_us in rules:
            # Not a comprehension: `yield` is not allowed in one.
            count = yield from self.run_prune_job(namespace, job, keep, older_than_us, limit)
            counts.append(count)
        return counts

    def job_register(
        self, namespace: str, jobs: Sequence[tuple[str, str, str]]
    ) -> Operation[list[JobRecord | None]]:
        now = yield from self._now()
        befores: list[JobRecord | None] = []
        for job, definition, fingerprint in jobs:
            before = yield from self._job(namespace, job, now)
            base = before if before is not None else new_job(namespace, job, now)
            yield self._put_job(
                replace(base, definition=definition, fingerprint=fingerprint, updated_us=now)
            )
            befores.append(before)
        return befores

    # -- replica heartbeats ----------------------------------------------------------------
    def replica_beat(
        self,
        namespace: str,
        replica: ReplicaInfo,
        ttl_us: int,
        retain_us: int = REPLICA_RETAIN_US,
    ) -> Operation[ReplicaRecord]:
        now = yield from self._now()
        params = {**replica_params(namespace, replica, ttl_us, retain_us), "now": now}
        yield Query("replica_prune", params)
        result: SqlResult = yield Query("replica_put", params)
        (record,) = REPLICAS.all(result, namespace)
        return record

    # -- the work queue ----------------------------------------------------------------------
    def _claim_rows(self, params: dict[str, object]) -> Operation[SqlResult]:
        """A claim in three statements of the operation's transaction, at the clock the
        first one read: SQLite's RETURNING gives the new values only, in no set order, so
        the claim order (the old available_us) is taken from the pick."""
        picked: SqlResult = yield Query("queue_claim_pick", params)
        if not picked.rows:
            return picked
        picks = _PICKS.all(picked)
        now = picks[0][2]
        dying = [item_id for item_id, dies, _ in picks if dies]
        order = {item_id: index for index, (item_id, dies, _) in enumerate(picks) if not dies}
        if dying:
            yield Query("queue_claim_kill", {**params, "ids": json.dumps(dying), "now": now})
        if not order:
            return SqlResult(rows=[], rowcount=0)
        result: SqlResult = yield Query(
            "queue_claim", {**params, "ids": json.dumps(list(order)), "now": now}
        )
        at = position(result.columns, "id", "queue item")
        rows = sorted(result.rows, key=lambda row: order[int(row[at])])
        return SqlResult(rows=rows, rowcount=result.rowcount, columns=result.columns)


def _picks(values: Iterable[Sequence[Any]]) -> list[tuple[int, bool, int]]:
    return [(int(item_id), bool(dying), int(now_us)) for item_id, dying, now_us in values]


_PICKS = RowDecoder("picked item", ("id", "dying", "now_us"), _picks)
"""An item a claim picked: its id, whether its expired claim used up its deliveries (it
dies instead), and the store's clock."""


def _holders(scope: str, values: Iterable[Sequence[Any]]) -> list[tuple[str, int, LocalHolder]]:
    return [
        (
            str(holder),
            int(fence),
            LocalHolder(
                scope=scope,
                pid=int(pid),
                start=int(start),
                group=None if group is None else int(group),
            ),
        )
        for holder, fence, pid, start, group in values
    ]


_HOLDERS = RowDecoder(
    "lease holder", ("holder", "fence", "holder_pid", "holder_start", "holder_group"), _holders
)
"""A held lease's holder and fence, and its process on this host (the scope the query
asked for)."""


_STORED: dict[type, tuple[str, ...]] = {}


def _stored(record: RunRecord | LeaseRecord | JobRecord) -> dict[str, Any]:
    """A record's columns as statement parameters, without the read time ``now_us``: its
    fields read one by one (their values are immutable; ``asdict`` would deep-copy each,
    which made registering 100,000 jobs cost 9 s of CPU)."""
    names = _STORED.get(type(record))
    if names is None:
        names = _STORED[type(record)] = tuple(
            field.name for field in fields(record) if field.name != "now_us"
        )
    return {name: getattr(record, name) for name in names}
