"""Retention: the run ledger stays bounded.

Each job keeps its finished runs while they are young (``retention``, default 30 days) and
its newest ``retention_keep`` (default 100) whatever their age
(:class:`~fleetcron.jobspec.Retention`); a run still queued, running or waiting for a
retry is never deleted. The replica that holds the namespace's monitor lease
(:mod:`fleetcron.scheduling.monitor`) applies the rule of every job it defines each
``retention_s`` (10 minutes): one pass deletes at most :data:`PASS_BATCHES` ×
:data:`PRUNE_LIMIT` rows per job, the jobs :data:`JOBS_PER_ROUND_TRIP` at a time in one
store operation, so a large backlog goes over several passes and no pass holds the store
for long. The pass logs how many rows
went (``runs_pruned``).

Job rows no replica defines any more are never deleted in the background. A job row this
replica does not define, that nobody registered, claimed or finished for
:data:`ORPHAN_AFTER_US` (7 days), is reported once per watch (``job_orphaned``);
``fleetcron prune --jobs`` deletes such rows by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from fleetcron._log import log
from fleetcron.durations import DurationLike, format_duration, to_micros
from fleetcron.errors import ConfigurationError
from fleetcron.job_options import check_job_name
from fleetcron.jobspec import DEFAULT_RETENTION, MAX_COUNT, JobSpec, Retention
from fleetcron.models import JobRecord, micros_to_datetime
from fleetcron.stores.base import AsyncStore, Operation, Operations, SyncStore
from fleetcron.stores.job_pages import after_page, job_pages, page_of

__all__ = [
    "COUNT_LIMIT",
    "DEFAULT_RETENTION_S",
    "JOBS_PER_ROUND_TRIP",
    "ORPHAN_AFTER_US",
    "PASS_BATCHES",
    "PRUNE_LIMIT",
    "OrphanJob",
    "PassResult",
    "Plan",
    "Pruner",
    "last_seen_us",
    "manual_rule",
    "orphaned",
    "prune_jobs_plan",
    "prune_runs_plan",
    "registered_retention",
    "run_plan",
    "run_plan_async",
    "store_retention",
]

T = TypeVar("T")

DEFAULT_RETENTION_S = 600.0
PRUNE_LIMIT = 500
"""Rows deleted by one store operation (one job, one round trip, one short transaction)."""
PASS_BATCHES = 10
"""Operations per job in one background pass, at most (so 5,000 rows per job per pass)."""
JOBS_PER_ROUND_TRIP = 200
"""Jobs pruned by one store operation of a pass (each job's deletion on its own): a pass
over 10,000 jobs with nothing to delete is 50 round trips, not 10,000."""
ORPHAN_AFTER_US = 7 * 86_400_000_000
"""A job row idle this long, and defined by no replica that watches, is an orphan."""
COUNT_LIMIT = 100_000
"""A dry run counts at most this many rows per job: one read, short even on Redis, where
a script holds the server while it runs."""


def last_seen_us(row: JobRecord) -> int:
    """The latest sign of a job's life in its row, on the store's clock: registered by a
    replica (or paused, resumed), a slot claimed or recorded, an outcome."""
    signs = (row.updated_us, row.high_water_us, row.last_success_us, row.last_failure_us)
    return max(sign for sign in signs if sign is not None)


def orphaned(row: JobRecord, idle_us: int) -> bool:
    """Whether ``row`` shows no sign of life for longer than ``idle_us`` at its ``now_us``."""
    return row.now_us - last_seen_us(row) > idle_us


def store_retention(store: object) -> Retention:
    """The retention of a job that sets none, on ``store``: its ``default_retention`` when
    it has one (etcd keeps every key in memory: a day and 10 runs), else
    :data:`DEFAULT_RETENTION`."""
    default = getattr(store, "default_retention", None)
    return default if isinstance(default, Retention) else DEFAULT_RETENTION


def registered_retention(row: JobRecord, default: Retention = DEFAULT_RETENTION) -> Retention:
    """The retention rule of a job's registered definition (what the jobs file of the
    replica that registered it last says), each part else ``default``'s."""
    try:
        definition = json.loads(row.definition)
    except ValueError:
        definition = None
    if not isinstance(definition, dict):
        return default
    older = definition.get("retention_us")
    keep = definition.get("retention_keep")
    return Retention(
        older_than_us=older if _count(older) else default.older_than_us,
        keep=keep if _count(keep) else default.keep,
    )


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def manual_rule(base: Retention, older_than: DurationLike | None, keep: int | None) -> Retention:
    """``base`` with the parts given by hand (``fleetcron prune --runs``): ``older_than``
    a duration, 0 or more; ``keep`` an integer, 0 or more. Bad values are a
    :class:`ConfigurationError`."""
    older_us = base.older_than_us
    if older_than is not None:
        if isinstance(older_than, str) and older_than.strip().startswith("-"):
            raise ConfigurationError(f"older_than must not be negative, got {older_than!r}")
        older_us = to_micros(older_than, what="older_than")
        if older_us < 0:
            raise ConfigurationError(f"older_than must not be negative, got {older_than!r}")
    if keep is not None and (not _count(keep)):
        raise ConfigurationError(f"keep must be an integer, 0 or more, got {keep!r}")
    if keep is not None and keep > MAX_COUNT:
        # As retention_keep in a jobs file: a larger one fails in the stores' arguments.
        raise ConfigurationError(f"keep must be 0 to {MAX_COUNT}, got {keep}")
    return Retention(older_than_us=older_us, keep=base.keep if keep is None else keep)


@dataclass(frozen=True, slots=True)
class OrphanJob:
    """A job row found idle by ``fleetcron prune --jobs``: no sign of life since
    ``last_seen_us`` (:func:`last_seen_us`) at the store's ``now_us``. ``deleted``: its row
    was deleted (a dry run: would be) — ``False`` when the job has a queued or running run,
    which keeps it; ``runs``: how many of its finished run rows went with it."""

    job: str
    last_seen_us: int
    now_us: int
    deleted: bool
    runs: int

    @property
    def idle_us(self) -> int:
        return self.now_us - self.last_seen_us


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one retention pass did: rows deleted per job (jobs with none left out), and
    whether it went over every job (``False``: it stopped early)."""

    pruned: dict[str, int]
    complete: bool

    @property
    def total(self) -> int:
        return sum(self.pruned.values())


Plan = Generator[Operation[Any], Any, T]
"""A manual prune as data: it yields store operations, each run on its own (its own short
transaction), and is sent their results; :func:`run_plan` and :func:`run_plan_async` drive
it, so ``Fleet`` and ``AsyncFleet`` share one implementation."""


def run_plan(plan: Plan[T], store: SyncStore) -> T:
    """Carry out ``plan`` on a sync store, one operation at a time."""
    try:
        operation = next(plan)
        while True:
            operation = plan.send(store.run(operation))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        plan.close()


async def run_plan_async(plan: Plan[T], store: AsyncStore) -> T:
    """Async twin of :func:`run_plan`."""
    try:
        operation = next(plan)
        while True:
            operation = plan.send(await store.run(operation))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        plan.close()


def prune_runs_plan(
    ops: Operations,
    namespace: str,
    *,
    older_than: DurationLike | None = None,
    keep: int | None = None,
    job: str | None = None,
    dry_run: bool = False,
    default: Retention = DEFAULT_RETENTION,
) -> Plan[dict[str, int]]:
    """``Fleet.prune_runs``: each job's registered rule (its parts not given: ``default``'s,
    the store's), with ``older_than`` and ``keep`` replacing its parts; rows deleted (or,
    ``dry_run``, counted) per job."""
    override = manual_rule(DEFAULT_RETENTION, older_than, keep)  # checked before any I/O
    pruned: dict[str, int] = {}
    after: str | None = ""
    while after is not None:
        if job is None:
            rows: list[JobRecord] = yield page_of(ops, namespace, after, definitions=True)
            after = after_page(rows)
        else:
            row: JobRecord | None = yield ops.job_get(namespace, check_job_name(job, "job"))
            if row is None:
                raise ConfigurationError(
                    f"no job {job!r} in namespace {namespace!r} (jobs register when a replica runs)"
                )
            rows, after = [row], None
        for row in rows:
            rule = registered_retention(row, default)
            rule = Retention(
                older_than_us=rule.older_than_us if older_than is None else override.older_than_us,
                keep=rule.keep if keep is None else override.keep,
            )
            count = yield from _job_runs_plan(ops, namespace, row.job, rule, dry_run)
            if count:
                pruned[row.job] = count
    return pruned


def _job_runs_plan(
    ops: Operations, namespace: str, job: str, rule: Retention, dry_run: bool
) -> Plan[int]:
    if dry_run:
        counted: int = yield ops.run_prune_job(
            namespace, job, rule.keep, rule.older_than_us, COUNT_LIMIT, dry_run=True
        )
        return counted
    total = 0
    while True:
        batch: int = yield ops.run_prune_job(
            namespace, job, rule.keep, rule.older_than_us, PRUNE_LIMIT
        )
        total += batch
        if batch < PRUNE_LIMIT:
            return total


def prune_jobs_plan(
    ops: Operations, namespace: str, idle_us: int, *, dry_run: bool = False
) -> Plan[list[OrphanJob]]:
    """``Fleet.prune_jobs``: every job row idle for ``idle_us``, deleted (with its finished
    runs) unless it has a queued or running run."""
    found: list[OrphanJob] = []
    after: str | None = ""
    while after is not None:
        rows: list[JobRecord] = yield page_of(ops, namespace, after)
        after = after_page(rows)
        for row in rows:
            if not orphaned(row, idle_us):
                continue
            deleted: bool = yield ops.job_delete(namespace, row.job, dry_run)
            runs = 0
            if deleted:
                runs = yield from _job_runs_plan(ops, namespace, row.job, Retention(0, 0), dry_run)
            found.append(
                OrphanJob(
                    job=row.job,
                    last_seen_us=last_seen_us(row),
                    now_us=row.now_us,
                    deleted=deleted,
                    runs=runs,
                )
            )
    return found


class Pruner:
    """The retention passes of one replica over the jobs it defines.

    ``specs`` is the replica's live mapping of its jobs (a reload changes it in place), so
    each pass applies the rules of the jobs file in force. ``limit`` and ``batches`` bound
    the work per job per pass, ``jobs_per_round_trip`` the jobs of one store operation;
    ``orphan_after_us`` is how long a job row this replica does not define must be idle to
    be reported.
    """

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        specs: Mapping[str, JobSpec],
        *,
        limit: int = PRUNE_LIMIT,
        batches: int = PASS_BATCHES,
        orphan_after_us: int = ORPHAN_AFTER_US,
        jobs_per_round_trip: int = JOBS_PER_ROUND_TRIP,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.specs = specs
        self.limit = limit
        self.batches = batches
        self.orphan_after_us = orphan_after_us
        self.jobs_per_round_trip = jobs_per_round_trip
        self.default = store_retention(store)
        """The rule of a job that sets none: the store's (:func:`store_retention`)."""
        self._reported: set[str] = set()

    def new_watch(self) -> None:
        """A new watch session begins: orphans are reported again."""
        self._reported.clear()

    async def prune(self, watching: Callable[[], bool] = lambda: True) -> PassResult:
        """One pass: each job's rule, then the orphan report. Stops early once
        ``watching()`` is false (the monitor lease was lost). Store errors propagate."""
        ops, pruned = self.store.ops, dict[str, int]()
        complete = True
        # Each round asks about `jobs_per_round_trip` jobs in one round trip; a job that
        # had `limit` rows to go is asked again in the next round, up to `batches` rounds.
        pending = sorted(self.specs)
        for _ in range(self.batches):
            again: list[str] = []
            for start in range(0, len(pending), self.jobs_per_round_trip):
                if not watching():
                    complete = False
                    break
                # A job removed by a reload meanwhile is no longer pruned.
                rules = []
                for name in pending[start : start + self.jobs_per_round_trip]:
                    spec = self.specs.get(name)
                    if spec is not None:
                        rule = spec.retention_with(self.default)
                        rules.append((name, rule.keep, rule.older_than_us))
                counts = await self.store.run(ops.run_prune_jobs(self.namespace, rules, self.limit))
                for (name, _, _), count in zip(rules, counts, strict=True):
                    if count:
                        pruned[name] = pruned.get(name, 0) + count
                    if count >= self.limit:
                        again.append(name)
            if not complete or not again:
                break
            pending = again
        result = PassResult(pruned=pruned, complete=complete)
        if result.total:
            log.info(
                "retention: deleted %d finished run(s) of %d job(s) from the ledger",
                result.total,
                len(pruned),
                extra={"action": "runs_pruned", "pruned": result.total, "jobs": len(pruned)},
            )
        if complete and watching():
            await self._report_orphans()
        return result

    async def _report_orphans(self) -> None:
        # A page at a time, without the definitions: only the signs of life are read.
        async for rows in job_pages(self.store, self.namespace):
            for row in rows:
                if row.job not in self.specs and row.job not in self._reported:
                    if orphaned(row, self.orphan_after_us):
                        self._report(row)

    def _report(self, row: JobRecord) -> None:
        self._reported.add(row.job)
        seen = last_seen_us(row)
        log.warning(
            "job %s: no replica registered, claimed or finished it for %s (since %s) "
            "and this replica does not define it; its rows stay until "
            "`fleetcron prune --jobs`",
            row.job,
            format_duration(row.now_us - seen),
            micros_to_datetime(seen).isoformat(),
            extra={"action": "job_orphaned", "job": row.job, "last_seen_us": seen},
        )
