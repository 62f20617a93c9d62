"""The operations of the SQL backends, shared by the three dialects.

The statements themselves live in ``<dialect>/queries.sql`` beside this module as named
blocks (``-- name: lease_acquire``, :mod:`fleetcron.stores.sql.files`); this module only
binds parameters and maps rows, so the dialects share one implementation of every
operation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
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
from fleetcron.stores.ledger import (
    LOST_ERROR,
    MISSED_ERROR,
    OUTPUT_LIMIT,
    backfill_slots,
    stored_text,
)
from fleetcron.stores.rows import ACQUIRED, JOBS, LEASES, REPLICAS, RUNS, RowDecoder
from fleetcron.stores.sql.statements import Query, QueryBatch, SqlResult

__all__ = [
    "SqlLedger",
    "SqlOperations",
    "backfill_params",
    "cancel_params",
    "claim_answers",
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
        # holds it; a matched count of 0 means it was held). The row is (fence, now_us);
        # the rest follows from the terms, so nothing more crosses the wire.
        if result.rowcount == 0:
            return None
        return ACQUIRED.first(result, namespace, name, holder, ttl_us, least_us)

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
        # MySQL's SELECT finds the row even when the UPDATE matched nothing: its matched
        # count (0) decides. PostgreSQL and SQLite return rows only for a match (SQLite may
        # report -1, "unknown", for a statement that starts with WITH).
        return LEASES.first(result, namespace) if result.rowcount != 0 else None

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        result: SqlResult = yield Query(
            "lease_release",
            {"namespace": namespace, "name": name, "holder": holder, "fence": fence},
        )
        return bool(result.rows) or result.rowcount > 0

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        result: SqlResult = yield Query("lease_get", {"namespace": namespace, "name": name})
        return LEASES.first(result, namespace)

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        result: SqlResult = yield Query("lease_list", {"namespace": namespace})
        return LEASES.all(result, namespace)

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


def _verdicts(values: Iterable[Sequence[Any]]) -> list[tuple[str, str | None]]:
    verdicts: list[tuple[str, str | None]] = []
    for status, stored in values:
        text = as_text(status)
        verdicts.append((text, as_text(stored) if text == "conflict" else None))
    return verdicts


_VERDICTS = RowDecoder("claim answer", ("status", "stored_fingerprint"), _verdicts)
"""A claim's status, and the registered fingerprint when it is a conflict."""


def claim_answers(
    namespace: str, claims: Sequence[SlotClaim], result: SqlResult
) -> list[ClaimResult]:
    """The answer to each of ``claims`` from the row of ``result`` in the same place: its
    ``status``, the run columns (NULL unless claimed) and the ``stored_fingerprint``
    (NULL unless a conflict)."""
    answers: list[ClaimResult] = []
    verdicts = _VERDICTS.all(result)
    for claim, row, (status, stored) in zip(claims, result.rows, verdicts, strict=True):
        run = RUNS.one(result.columns, row, namespace) if status == "claimed" else None
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


def _settled(values: Iterable[Sequence[Any]]) -> list[tuple[str, int]]:
    return [(as_text(job), int(slot_us)) for job, slot_us in values]


_SETTLED = RowDecoder("settled slot", ("job", "slot_us"), _settled)
"""The ``(job, slot_us)`` of a slot that has a row other than queued."""


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


def cancel_params(
    namespace: str, job: str, slot_us: int | None, note: str | None
) -> dict[str, object]:
    """The bound parameters of ``run_cancel`` (every dialect uses the same names)."""
    return {"namespace": namespace, "job": job, "slot_us": slot_us, "note": stored_text(note)}


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

    Rows are read by column name: runs with :data:`~fleetcron.stores.rows.RUNS`, jobs with
    :data:`~fleetcron.stores.rows.JOBS`, replicas with
    :data:`~fleetcron.stores.rows.REPLICAS`.
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
            answers += claim_answers(namespace, [claim], result)  # its one row
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
        return RUNS.first(result, namespace)

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

    def run_cancel(
        self, namespace: str, job: str, slot_us: int | None = None, note: str | None = None
    ) -> Operation[int]:
        result: SqlResult = yield Query("run_cancel", cancel_params(namespace, job, slot_us, note))
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
            runs = RUNS.all(result, namespace)
            if len(runs) < limit or all(run.job in wanted for run in runs):
                return [run for run in runs if run.job in wanted]
            asked = {**asked, "jobs": json.dumps(list(jobs))}
        result = yield Query("run_due", asked)
        return RUNS.all(result, namespace)

    def run_settled(
        self, namespace: str, slots: Sequence[tuple[str, int]]
    ) -> Operation[set[tuple[str, int]]]:
        if not slots:
            return set()
        # One JSON array of [job, slot_us] pairs: every dialect unpacks it server-side.
        pairs = json.dumps([[job, slot] for job, slot in slots])
        result: SqlResult = yield Query("run_settled", {"namespace": namespace, "pairs": pairs})
        return set(_SETTLED.all(result))

    def run_get(self, namespace: str, job: str, slot_us: int) -> Operation[RunRecord | None]:
        result: SqlResult = yield Query(
            "run_get", {"namespace": namespace, "job": job, "slot_us": slot_us}
        )
        return RUNS.first(result, namespace)

    def run_list(self, namespace: str, job: str | None, limit: int) -> Operation[list[RunRecord]]:
        if job is None:
            result: SqlResult = yield Query("run_list", {"namespace": namespace, "limit": limit})
        else:
            result = yield Query(
                "run_list_job",
                {"namespace": namespace, "job": job, "limit": limit, "output": True},
            )
        return RUNS.all(result, namespace)

    def run_list_many(
        self, namespace: str, jobs: Sequence[str], limit: int, *, output: bool = True
    ) -> Operation[list[list[RunRecord]]]:
        if not jobs or limit <= 0:
            return [[] for _ in jobs]
        batch = tuple(
            {"namespace": namespace, "job": job, "limit": limit, "output": output} for job in jobs
        )
        results: list[SqlResult] = yield QueryBatch("run_list_job", batch)
        return [RUNS.all(result, namespace) for result in results]

    def run_running(
        self, namespace: str, jobs: Sequence[str], limit: int
    ) -> Operation[list[RunRecord]]:
        if not jobs or limit <= 0:
            return []
        # The namespace's running rows without the names (thousands to send, for a few
        # rows back): the others' are dropped here.
        result: SqlResult = yield Query("run_running", {"namespace": namespace, "skip": limit - 1})
        wanted = set(jobs)
        runs = RUNS.decode(result.columns, result.rows, namespace)
        return [run for run in runs if run.job in wanted]

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
        return [JOBS.first(result, namespace) for result in results]

    def job_set_paused(self, namespace: str, job: str, paused: bool) -> Operation[bool]:
        params = {"namespace": namespace, "job": job}
        if paused:
            yield Query("job_pause", params)
            return True
        result: SqlResult = yield Query("job_resume", params)
        if not (result.rows or result.rowcount > 0):
            return False
        # A second statement, not one with the first: a registration or a pause between
        # them leaves the row, resumed or paused again, as it would after both.
        yield Query("job_forget", params)
        return True

    def job_get(self, namespace: str, job: str) -> Operation[JobRecord | None]:
        result: SqlResult = yield Query("job_get", {"namespace": namespace, "job": job})
        return JOBS.first(result, namespace)

    def job_list(self, namespace: str) -> Operation[list[JobRecord]]:
        result: SqlResult = yield Query("job_list", {"namespace": namespace})
        return JOBS.all(result, namespace)

    def job_page(
        self, namespace: str, after: str, limit: int, *, definitions: bool = True
    ) -> Operation[list[JobRecord]]:
        if limit <= 0:
            return []
        params = {"namespace": namespace, "after": after, "limit": limit}
        result: SqlResult = yield Query("job_page", {**params, "definitions": definitions})
        return JOBS.all(result, namespace)

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
        (record,) = REPLICAS.all(result, namespace)
        return record

    def replica_list(
        self, namespace: str, gone_within_us: int = REPLICA_RETAIN_US
    ) -> Operation[list[ReplicaRecord]]:
        result: SqlResult = yield Query(
            "replica_list", {"namespace": namespace, "gone_within_us": gone_within_us}
        )
        return REPLICAS.all(result, namespace)

    def replica_leave(self, namespace: str, replica_id: str) -> Operation[bool]:
        result: SqlResult = yield Query(
            "replica_leave", {"namespace": namespace, "replica_id": replica_id}
        )
        return bool(result.rows) or result.rowcount > 0
