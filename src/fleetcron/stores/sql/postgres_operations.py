"""PostgreSQL's operations: the shared SQL operations (leases, the run ledger, the work
queue, checkpoints), with the batches of claims and outcomes sent as one function call per
transaction (a JSON array of the items) and a status read of many jobs as one statement;
and how a batch of per-job statements is grouped into transactions
(:func:`batch_transactions`), which the store's pipeline follows too."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fleetcron.errors import StoreError
from fleetcron.models import ClaimResult, RunFinish, RunRecord, SlotClaim
from fleetcron.stores.base import Operation
from fleetcron.stores.rows import RUNS, position
from fleetcron.stores.sql.checkpoints import SqlCheckpoints
from fleetcron.stores.sql.operations import (
    SqlLedger,
    SqlOperations,
    claim_answers,
    claim_params,
    finish_params,
)
from fleetcron.stores.sql.queue import SqlQueue
from fleetcron.stores.sql.statements import Query, QueryBatch, SqlResult

__all__ = ["PostgresOperations", "batch_transactions"]

# The fields of one item of a batch call, in the order of its JSON array
# (fleetcron_run_claim_many_v1, fleetcron_run_finish_many_v1), named as in the parameters
# of a single claim or outcome.
_CLAIM_FIELDS = (
    "job",
    "lease_name",
    "slot_us",
    "run_id",
    "exclusive",
    "max_attempts",
    "trigger",
    "least_us",
    "deadline_us",
    "progress",
    "pausable",
    "fingerprint",
)
_CLAIM_SHARED = ("namespace", "holder", "ttl_us", "lost_error", "missed_error")
_FINISH_FIELDS = (
    "job",
    "lease_name",
    "slot_us",
    "fence",
    "state",
    "exit_code",
    "error",
    "output",
    "retry_after_us",
)


def _calls(
    batch: Sequence[Mapping[str, object]], fields: Sequence[str], shared: Sequence[str]
) -> list[tuple[list[int], dict[str, object]]]:
    """A batch of per-item parameters as one call per transaction of
    :func:`batch_transactions` (usually one): the ``shared`` parameters, and ``items``, a
    JSON array of each item's ``fields`` in job order — the lock order. With the indexes
    of the items each call decides, in its order."""
    calls = []
    for group in batch_transactions(batch):
        params: dict[str, object] = {name: batch[group[0]][name] for name in shared}
        params["items"] = json.dumps([[batch[index][name] for name in fields] for index in group])
        calls.append((group, params))
    return calls


def _by_item(
    count: int,
    calls: list[tuple[list[int], dict[str, object]]],
    results: Sequence[SqlResult],
    record: str,
) -> SqlResult:
    """The answer rows of every item, in input order, from the rows of each call (their
    column ``ord``: the item's position in the call, from 1), as one result."""
    rows: list[tuple[Any, ...] | None] = [None] * count
    columns = results[0].columns if results else ()
    for (group, _), result in zip(calls, results, strict=True):
        if not result.rows:
            continue
        at = position(result.columns, "ord", record)
        for row in result.rows:
            rows[group[int(row[at]) - 1]] = row
    if any(row is None for row in rows):
        raise StoreError("the store answered a batch with fewer rows than it has items")
    return SqlResult(rows=rows, rowcount=count, columns=columns)  # type: ignore[arg-type]


class PostgresOperations(SqlOperations, SqlLedger, SqlQueue, SqlCheckpoints):
    """Lease, run-ledger, work-queue and checkpoint operations of PostgreSQL."""

    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        # One call per transaction, its claims in a JSON array (fleetcron_run_claim_many_v1): a
        # statement per claim costs the replica and the server more than the claim.
        if len(claims) < 2:
            return (yield from super().run_claim(namespace, claims, holder, ttl_us))
        batch = [claim_params(namespace, claim, holder, ttl_us) for claim in claims]
        calls = _calls(batch, _CLAIM_FIELDS, _CLAIM_SHARED)
        results: list[SqlResult] = yield QueryBatch(
            "run_claim_many", tuple(params for _, params in calls)
        )
        answers = _by_item(len(claims), calls, results, "claim answer")
        return claim_answers(namespace, claims, answers)

    def run_finish_many(
        self, namespace: str, finishes: Sequence[RunFinish]
    ) -> Operation[list[bool]]:
        if len(finishes) < 2:
            return (yield from super().run_finish_many(namespace, finishes))
        batch = [finish_params(namespace, finish) for finish in finishes]
        calls = _calls(batch, _FINISH_FIELDS, ("namespace",))
        results: list[SqlResult] = yield QueryBatch(
            "run_finish_many", tuple(params for _, params in calls)
        )
        answers = _by_item(len(finishes), calls, results, "outcome answer")
        at = position(answers.columns, "accepted", "outcome answer")
        return [bool(row[at]) for row in answers.rows]

    def run_list_many(
        self, namespace: str, jobs: Sequence[str], limit: int, *, output: bool = True
    ) -> Operation[list[list[RunRecord]]]:
        # One statement (a lateral index scan per job), not a pipeline of one per job: a
        # status read of thousands of jobs is one result to fetch, not thousands.
        if not jobs or limit <= 0:
            return [[] for _ in jobs]
        result: SqlResult = yield Query(
            "run_list_many",
            {
                "namespace": namespace,
                "jobs": json.dumps(list(jobs)),
                "limit": limit,
                "output": output,
            },
        )
        ledgers: list[list[tuple[Any, ...]]] = [[] for _ in jobs]
        if result.rows:
            at = position(result.columns, "ord", RUNS.record)
            for row in result.rows:
                ledgers[int(row[at]) - 1].append(row)
        return [RUNS.decode(result.columns, rows, namespace) for rows in ledgers]


def batch_transactions(batch: Sequence[Mapping[str, object]]) -> list[list[int]]:
    """How a batch of per-job statements (claims, outcomes, registrations) is grouped into
    transactions, by index: the *k*-th item of every job goes into the *k*-th transaction,
    and each transaction holds its items in job order. So one transaction
    commits a whole batch of distinct jobs (one flush of the WAL instead of one per item),
    and every transaction takes its row locks in one global order — by job, and within a
    job lease, run, job row, the order every ledger function keeps — so two batches never
    wait for each other in a cycle. The items of one job keep their input order (the first
    is decided first, in the first transaction). Items without a job each get a
    transaction of their own."""

    # Stable: the items of one job keep their input order, so they are decided in it.
    keyed = sorted(
        (i for i in range(len(batch)) if "job" in batch[i]), key=lambda i: str(batch[i]["job"])
    )
    groups: list[list[int]] = []
    taken: dict[str, int] = {}
    for index in keyed:
        job = str(batch[index]["job"])
        rank = taken.get(job, 0)
        taken[job] = rank + 1
        if rank == len(groups):
            groups.append([])
        groups[rank].append(index)
    groups += [[i] for i in range(len(batch)) if "job" not in batch[i]]
    return groups
