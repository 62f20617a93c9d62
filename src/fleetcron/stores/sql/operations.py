"""The operations of the SQL backends, shared by the three dialects.

The statements themselves live in ``<dialect>/queries.sql`` beside this module as named
blocks (``-- name: lease_acquire``, :mod:`fleetcron.stores.sql.files`); this module only
binds parameters and maps rows, so the dialects share one implementation of every
operation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

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
from fleetcron.stores.base import (
    REPLICA_PRUNE_LIMIT,
    Operation,
    SqlResult,
    acquired_record,
    as_text,
    rows_to_jobs,
    rows_to_records,
    rows_to_replicas,
    rows_to_runs,
)
from fleetcron.stores.ledger import (
    LOST_ERROR,
    MISSED_ERROR,
    OUTPUT_LIMIT,
    backfill_slots,
    stored_text,
)
from fleetcron.stores.statements import Query, QueryBatch

__all__ = [
    "SqlLedger",
    "SqlOperations",
    "backfill_params",
    "claim_params",
    "finish_params",
    "prune_job_params",
    "replica_params",
]


class SqlOperations:
    """Lease operations as statement generators, shared by every SQL dialect.

    ``creates_rows``: the dialect's ``lease_acquire`` only updates an existing row, reads
    the row back whoever holds it and reports the UPDATE's matched count (MySQL, which has
    no ``RETURNING``); a missing row is made with ``lease_create`` and the acquire tried
    once more. Otherwise ``lease_acquire`` returns a row only when it took the lease.
    """

    def __init__(self, *, creates_rows: bool = False) -> None:
        self.creates_rows = creates_rows

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        params = {
            "namespace": namespace,
            "name": name,
            "holder": holder,
            "ttl_us": ttl_us,
            "least_us": least_us,
        }
        result: SqlResult = yield Query("lease_acquire", params)
        if not result.rows and self.creates_rows:
            yield Query("lease_create", {"namespace": namespace, "name": name})
            result = yield Query("lease_acquire", params)
        # Taken only if the statement changed the row (MySQL reads the row back whoever
        # holds it; a matched count of 0 means it was held). The row is (fence, store now);
        # the rest follows from the terms, so nothing more crosses the wire.
        if not result.rows or result.rowcount == 0:
            return None
        fence, now = (int(value) for value in result.rows[0][:2])
        return acquired_record(namespace, name, holder, fence, now, ttl_us, least_us)

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        result: SqlResult = yield Query(
            "lease_extend",
            {
                "namespace": namespace,
                "name": name,
                "holder": holder,
                "fence": fence,
                "ttl_us": ttl_us,
            },
        )
        records = rows_to_records(namespace, result.rows)
        # MySQL's SELECT finds the row even when the UPDATE matched nothing: its matched
        # count (0) decides. PostgreSQL and SQLite return rows only for a match (SQLite may
        # report -1, "unknown", for a statement that starts with WITH).
        return records[0] if records and result.rowcount != 0 else None

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        result: SqlResult = yield Query(
            "lease_release",
            {"namespace": namespace, "name": name, "holder": holder, "fence": fence},
        )
        return bool(result.rows) or result.rowcount > 0

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        result: SqlResult = yield Query("lease_get", {"namespace": namespace, "name": name})
        records = rows_to_records(namespace, result.rows)
        return records[0] if records else None

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        result: SqlResult = yield Query("lease_list", {"namespace": namespace})
        return rows_to_records(namespace, result.rows)

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        params = {"namespace": namespace, "older_than_us": older_than_us}
        result: SqlResult = yield Query("lease_prune_preview" if dry_run else "lease_prune", params)
        return sorted(as_text(row[0]) for row in result.rows)


def claim_params(namespace: str, claim: SlotClaim, holder: str, ttl_us: int) -> dict[str, object]:
    """The bound parameters of one slot claim (every dialect uses the same names)."""
    return {
        "namespace": namespace,
        "job": claim.job,
        "lease_name": job_lease_name(claim.job),
        "slot_us": claim.slot_us,
        "run_id": claim.run_id,
        "exclusive": claim.exclusive,
        "max_attempts": claim.max_attempts,
        "trigger": claim.trigger,
        "progress": claim.moves_progress,
        "pausable": claim.pausable,
        "least_us": claim.least_us,
        "holder": holder,
        "ttl_us": ttl_us,
        "deadline_us": claim.deadline_us,
        "fingerprint": claim.fingerprint,
        "lost_error": LOST_ERROR,
        "missed_error": MISSED_ERROR,
        "output_limit": OUTPUT_LIMIT,
    }


def claim_answer(namespace: str, claim: SlotClaim, row: Sequence[object]) -> ClaimResult:
    """The answer to ``claim`` from its row: (status, 17 run columns… or NULLs, the
    registered fingerprint when the status is conflict)."""
    status = as_text(row[0])
    run = rows_to_runs(namespace, [tuple(row[1:])])[0] if status == "claimed" else None
    stored = as_text(row[18]) if status == "conflict" else None
    return ClaimResult(
        job=claim.job, slot_us=claim.slot_us, status=status, run=run, stored_fingerprint=stored
    )


def _note_params(namespace: str, note: RunNote) -> dict[str, object]:
    return {
        "namespace": namespace,
        "job": note.job,
        "slot_us": note.slot_us,
        "state": note.state,
        "error": note.error,
        "trigger": note.trigger,
    }


def backfill_params(namespace: str, job: str, slots: Sequence[int]) -> dict[str, object]:
    """The bound parameters of ``run_backfill`` (every dialect uses the same names): the
    slots as one JSON array, unpacked server-side into one statement's rows."""
    return {
        "namespace": namespace,
        "job": job,
        "slots": json.dumps(backfill_slots(slots)),
    }


def finish_params(namespace: str, finish: RunFinish) -> dict[str, object]:
    """The bound parameters of one ``run_finish`` (every dialect uses the same names)."""
    outcome = finish.outcome
    return {
        "namespace": namespace,
        "job": finish.job,
        "lease_name": job_lease_name(finish.job),
        "slot_us": finish.slot_us,
        "fence": finish.fence,
        "state": outcome.state,
        "exit_code": outcome.exit_code,
        "error": stored_text(outcome.error),
        "output": stored_text(outcome.output, tail=True),
        "retry_after_us": outcome.retry_after_us if outcome.state == "failed" else None,
    }


def prune_job_params(
    namespace: str, job: str, keep: int, older_than_us: int, limit: int
) -> dict[str, object]:
    """The bound parameters of ``run_prune_job`` (every dialect uses the same names):
    ``keep_offset`` is the offset, newest first, of the oldest finished row kept, and
    ``limit_offset`` that of the last row a call may delete, oldest first."""
    keep = max(keep, 0)
    return {
        "namespace": namespace,
        "job": job,
        "keep": keep,
        "keep_offset": max(keep - 1, 0),
        "older_than_us": older_than_us,
        "limit": limit,
        "limit_offset": max(limit - 1, 0),
    }


def replica_params(
    namespace: str, replica: ReplicaInfo, ttl_us: int, retain_us: int
) -> dict[str, object]:
    """The bound parameters of one heartbeat (every dialect uses the same names)."""
    return {
        "namespace": namespace,
        "replica_id": replica.replica_id,
        "host": replica.host,
        "pid": replica.pid,
        "version": replica.version,
        "mode": replica.mode,
        "jobs_fingerprint": replica.jobs_fingerprint,
        "ttl_us": ttl_us,
        "retain_us": retain_us,
        "prune_limit": REPLICA_PRUNE_LIMIT,
    }


class SqlLedger:
    """Run-ledger and replica-heartbeat operations for dialects that express each one as a
    single named query (a function call or one statement on PostgreSQL, a multi-statement
    transaction on MySQL).

    Row shapes: runs as :func:`~fleetcron.stores.base.rows_to_runs`, jobs as
    :func:`~fleetcron.stores.base.rows_to_jobs`, replicas as
    :func:`~fleetcron.stores.base.rows_to_replicas`.
    """

    def store_now(self) -> Operation[int]:
        result: SqlResult = yield Query("store_now")
        return int(result.rows[0][0])

    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        if not claims:
            return []
        batch = tuple(claim_params(namespace, claim, holder, ttl_us) for claim in claims)
        results: list[SqlResult] = yield QueryBatch("run_claim", batch)
        answers: list[ClaimResult] = []
        for claim, result in zip(claims, results, strict=True):
            (row,) = result.rows
            answers.append(claim_answer(namespace, claim, row))
        return answers

    def run_extend(
        self, namespace: str, job: str, slot_us: int, fence: int, ttl_us: int
    ) -> Operation[RunRecord | None]:
        result: SqlResult = yield Query(
            "run_extend",
            {
                "namespace": namespace,
                "job": job,
                "lease_name": job_lease_name(job),
                "slot_us": slot_us,
                "fence": fence,
                "ttl_us": ttl_us,
            },
        )
        runs = rows_to_runs(namespace, result.rows)
        return runs[0] if runs else None

    def run_finish(
        self, namespace: str, job: str, slot_us: int, fence: int, outcome: RunOutcome
    ) -> Operation[bool]:
        params = finish_params(namespace, RunFinish(job, slot_us, fence, outcome))
        result: SqlResult = yield Query("run_finish", params)
        return bool(result.rows and result.rows[0][0])

    def run_finish_many(
        self, namespace: str, finishes: Sequence[RunFinish]
    ) -> Operation[list[bool]]:
        if not finishes:
            return []
        batch = tuple(finish_params(namespace, finish) for finish in finishes)
        results: list[SqlResult] = yield QueryBatch("run_finish", batch)
        return [bool(result.rows and result.rows[0][0]) for result in results]

    def run_record(
        self,
        namespace: str,
        job: str,
        slot_us: int,
        state: str,
        error: str | None,
        trigger: str,
    ) -> Operation[bool]:
        note = RunNote(job, slot_us, state, error, trigger)
        result: SqlResult = yield Query("run_record", _note_params(namespace, note))
        return bool(result.rows and result.rows[0][0])

    def run_record_many(self, namespace: str, notes: Sequence[RunNote]) -> Operation[list[bool]]:
        if not notes:
            return []
        batch = tuple(_note_params(namespace, note) for note in notes)
        results: list[SqlResult] = yield QueryBatch("run_record", batch)
        return [bool(result.rows and result.rows[0][0]) for result in results]

    def run_backfill(self, namespace: str, job: str, slots: Sequence[int]) -> Operation[int]:
        if not slots:
            return 0
        result: SqlResult = yield Query("run_backfill", backfill_params(namespace, job, slots))
        return int(result.rows[0][0])

    def run_cancel(self, namespace: str, job: str) -> Operation[int]:
        result: SqlResult = yield Query("run_cancel", {"namespace": namespace, "job": job})
        return int(result.rows[0][0]) if result.rows else max(result.rowcount, 0)

    def run_due(
        self, namespace: str, limit: int, jobs: Sequence[str] | None = None
    ) -> Operation[list[RunRecord]]:
        if jobs is not None and not jobs:
            return []
        asked: dict[str, object] = {"namespace": namespace, "limit": limit, "jobs": None}
        if jobs is not None:
            # Usually nothing or little is due: the namespace's rows are asked for without
            # the names (thousands to send and unpack on every poll) and the others'
            # dropped here. Only a full page holding others' rows may hide some of ours:
            # then the names go with the query.
            result: SqlResult = yield Query("run_due", asked)
            wanted = set(jobs)
            runs = rows_to_runs(namespace, result.rows)
            if len(runs) < limit or all(run.job in wanted for run in runs):
                return [run for run in runs if run.job in wanted]
            asked = {**asked, "jobs": json.dumps(list(jobs))}
        result = yield Query("run_due", asked)
        return rows_to_runs(namespace, result.rows)

    def run_settled(
        self, namespace: str, slots: Sequence[tuple[str, int]]
    ) -> Operation[set[tuple[str, int]]]:
        if not slots:
            return set()
        # One JSON array of [job, slot_us] pairs: every dialect unpacks it server-side.
        pairs = json.dumps([[job, slot] for job, slot in slots])
        result: SqlResult = yield Query("run_settled", {"namespace": namespace, "pairs": pairs})
        return {(as_text(row[0]), int(row[1])) for row in result.rows}

    def run_get(self, namespace: str, job: str, slot_us: int) -> Operation[RunRecord | None]:
        result: SqlResult = yield Query(
            "run_get", {"namespace": namespace, "job": job, "slot_us": slot_us}
        )
        runs = rows_to_runs(namespace, result.rows)
        return runs[0] if runs else None

    def run_list(self, namespace: str, job: str | None, limit: int) -> Operation[list[RunRecord]]:
        if job is None:
            result: SqlResult = yield Query("run_list", {"namespace": namespace, "limit": limit})
        else:
            result = yield Query(
                "run_list_job",
                {"namespace": namespace, "job": job, "limit": limit, "output": True},
            )
        return rows_to_runs(namespace, result.rows)

    def run_list_many(
        self, namespace: str, jobs: Sequence[str], limit: int, *, output: bool = True
    ) -> Operation[list[list[RunRecord]]]:
        if not jobs or limit <= 0:
            return [[] for _ in jobs]
        batch = tuple(
            {"namespace": namespace, "job": job, "limit": limit, "output": output} for job in jobs
        )
        results: list[SqlResult] = yield QueryBatch("run_list_job", batch)
        return [rows_to_runs(namespace, result.rows) for result in results]

    def run_running(
        self, namespace: str, jobs: Sequence[str], limit: int
    ) -> Operation[list[RunRecord]]:
        if not jobs or limit <= 0:
            return []
        # The namespace's running rows without the names (thousands to send, for a few
        # rows back): the others' are dropped here.
        result: SqlResult = yield Query("run_running", {"namespace": namespace, "skip": limit - 1})
        wanted = set(jobs)
        return [run for run in rows_to_runs(namespace, result.rows) if run.job in wanted]

    def run_prune(self, namespace: str, keep: int, older_than_us: int) -> Operation[int]:
        result: SqlResult = yield Query(
            "run_prune", {"namespace": namespace, "keep": keep, "older_than_us": older_than_us}
        )
        return int(result.rows[0][0]) if result.rows else max(result.rowcount, 0)

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
        name = "run_prune_job_preview" if dry_run else "run_prune_job"
        result: SqlResult = yield Query(
            name, prune_job_params(namespace, job, keep, older_than_us, limit)
        )
        return int(result.rows[0][0]) if result.rows else max(result.rowcount, 0)

    def run_prune_jobs(
        self, namespace: str, rules: Sequence[tuple[str, int, int]], limit: int
    ) -> Operation[list[int]]:
        if limit <= 0 or not rules:
            return [0] * len(rules)
        batch = tuple(
            prune_job_params(namespace, job, keep, older_than_us, limit)
            for job, keep, older_than_us in rules
        )
        results: list[SqlResult] = yield QueryBatch("run_prune_job", batch)
        return [
            int(result.rows[0][0]) if result.rows else max(result.rowcount, 0) for result in results
        ]

    def job_delete(self, namespace: str, job: str, dry_run: bool = False) -> Operation[bool]:
        name = "job_delete_preview" if dry_run else "job_delete"
        result: SqlResult = yield Query(name, {"namespace": namespace, "job": job})
        return bool(result.rows) or result.rowcount > 0

    def job_register(
        self, namespace: str, jobs: Sequence[tuple[str, str, str]]
    ) -> Operation[list[JobRecord | None]]:
        if not jobs:
            return []
        batch = tuple(
            {"namespace": namespace, "job": job, "definition": definition, "fingerprint": fp}
            for job, definition, fp in jobs
        )
        results: list[SqlResult] = yield QueryBatch("job_register", batch)
        befores: list[JobRecord | None] = []
        for result in results:
            rows = rows_to_jobs(namespace, result.rows)
            befores.append(rows[0] if rows else None)
        return befores

    def job_set_paused(self, namespace: str, job: str, paused: bool) -> Operation[bool]:
        result: SqlResult = yield Query(
            "job_set_paused", {"namespace": namespace, "job": job, "paused": paused}
        )
        return bool(result.rows) or result.rowcount > 0

    def job_get(self, namespace: str, job: str) -> Operation[JobRecord | None]:
        result: SqlResult = yield Query("job_get", {"namespace": namespace, "job": job})
        jobs = rows_to_jobs(namespace, result.rows)
        return jobs[0] if jobs else None

    def job_list(self, namespace: str) -> Operation[list[JobRecord]]:
        result: SqlResult = yield Query("job_list", {"namespace": namespace})
        return rows_to_jobs(namespace, result.rows)

    def job_namespaces(self) -> Operation[list[str]]:
        result: SqlResult = yield Query("job_namespaces", {})
        return sorted(as_text(row[0]) for row in result.rows)

    # -- replica heartbeats (docs/design/replicas.md) ----------------------------------------
    def replica_beat(
        self,
        namespace: str,
        replica: ReplicaInfo,
        ttl_us: int,
        retain_us: int = REPLICA_RETAIN_US,
    ) -> Operation[ReplicaRecord]:
        result: SqlResult = yield Query(
            "replica_beat", replica_params(namespace, replica, ttl_us, retain_us)
        )
        (record,) = rows_to_replicas(namespace, result.rows)
        return record

    def replica_list(
        self, namespace: str, gone_within_us: int = REPLICA_RETAIN_US
    ) -> Operation[list[ReplicaRecord]]:
        result: SqlResult = yield Query(
            "replica_list", {"namespace": namespace, "gone_within_us": gone_within_us}
        )
        return rows_to_replicas(namespace, result.rows)

    def replica_leave(self, namespace: str, replica_id: str) -> Operation[bool]:
        result: SqlResult = yield Query(
            "replica_leave", {"namespace": namespace, "replica_id": replica_id}
        )
        return bool(result.rows) or result.rowcount > 0
