"""The run ledger of the in-memory store, over dicts: the reference the other backends
are held to (the rules themselves are :mod:`fleetcron.stores.ledger`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fleetcron.models import (
    FINAL_STATES,
    ClaimResult,
    JobRecord,
    RunFinish,
    RunNote,
    RunOutcome,
    RunRecord,
    SlotClaim,
    job_lease_name,
)
from fleetcron.stores.base import Operation, conflict_answer
from fleetcron.stores.ledger import (
    backfill_slots,
    backfilled_run,
    decide_claim,
    decide_extend,
    decide_finish,
    new_job,
    noted_run,
    placeholder,
    stored_text,
)
from fleetcron.stores.memory_state import State, atomic

__all__ = ["MemoryLedger"]


class MemoryLedger:
    """The run ledger over dicts: the reference the other backends are held to."""

    def store_now(self) -> Operation[int]:
        result: int = yield atomic(lambda _state, now: now)
        return result

    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        def step(state: State, now: int) -> list[ClaimResult]:
            answers = []
            for claim in claims:
                lease_key = (namespace, job_lease_name(claim.job))
                job = state.jobs.get((namespace, claim.job))
                conflict = conflict_answer(claim, job, now)
                if conflict is not None:
                    answers.append(conflict)
                    continue
                decision = decide_claim(
                    namespace=namespace,
                    claim=claim,
                    holder=holder,
                    ttl_us=ttl_us,
                    now=now,
                    run=state.runs.get((namespace, claim.job, claim.slot_us)),
                    lease=state.leases.get(lease_key),
                    job=job,
                )
                if decision.closed is not None:
                    state.runs[(namespace, claim.job, claim.slot_us)] = decision.closed
                    if decision.status == "missed" and claim.moves_progress:
                        _raise_high_water(state, namespace, claim.job, claim.slot_us, now)
                answers.append(
                    ClaimResult(
                        job=claim.job,
                        slot_us=claim.slot_us,
                        status=decision.status,
                        run=decision.run,
                    )
                )
                if decision.run is None or decision.lease is None:
                    continue
                state.leases[lease_key] = replace(decision.lease, name=lease_key[1])
                state.runs[(namespace, claim.job, claim.slot_us)] = decision.run
                if claim.moves_progress:
                    _raise_high_water(state, namespace, claim.job, claim.slot_us, now)
            return answers

        result: list[ClaimResult] = yield atomic(step)
        return result

    def run_extend(
        self, namespace: str, job: str, slot_us: int, fence: int, ttl_us: int
    ) -> Operation[RunRecord | None]:
        def step(state: State, now: int) -> RunRecord | None:
            lease_key = (namespace, job_lease_name(job))
            run, lease = decide_extend(
                run=state.runs.get((namespace, job, slot_us)),
                lease=state.leases.get(lease_key),
                fence=fence,
                ttl_us=ttl_us,
                now=now,
            )
            if run is not None:
                state.runs[(namespace, job, slot_us)] = run
            if lease is not None:
                state.leases[lease_key] = lease
            return run

        result: RunRecord | None = yield atomic(step)
        return result

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
        def step(state: State, now: int) -> list[bool]:
            return [_finish(state, namespace, finish, now) for finish in finishes]

        result: list[bool] = yield atomic(step)
        return result

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
        def step(state: State, now: int) -> list[bool]:
            return [_record(state, namespace, note, now) for note in notes]

        result: list[bool] = yield atomic(step)
        return result

    def run_backfill(self, namespace: str, job: str, slots: Sequence[int]) -> Operation[int]:
        def step(state: State, now: int) -> int:
            fresh = [
                slot
                for slot in backfill_slots(slots)
                if slot <= now and (namespace, job, slot) not in state.runs
            ]
            for slot in fresh:  # after every check: nothing is written if one fails
                state.runs[(namespace, job, slot)] = backfilled_run(namespace, job, slot, now)
            return len(fresh)

        result: int = yield atomic(step)
        return result

    def run_cancel(
        self, namespace: str, job: str, slot_us: int | None = None, note: str | None = None
    ) -> Operation[int]:
        def step(state: State, now: int) -> int:
            if slot_us is None:
                rows = [
                    (key, run) for key, run in state.runs.items() if key[:2] == (namespace, job)
                ]
            else:  # one key: on etcd, one read rather than a scan of the namespace's runs
                key = (namespace, job, slot_us)
                rows = [(key, run) for run in (state.runs.get(key),) if run is not None]
            asked = 0
            for key, run in rows:
                if run.state == "running" and run.expires_us is not None and run.expires_us > now:
                    error = run.error if note is None else stored_text(note)
                    state.runs[key] = replace(run, cancel_requested=True, error=error)
                    asked += 1
            return asked

        result: int = yield atomic(step)
        return result

    def run_due(
        self, namespace: str, limit: int, jobs: Sequence[str] | None = None
    ) -> Operation[list[RunRecord]]:
        wanted = None if jobs is None else set(jobs)

        def step(state: State, now: int) -> list[RunRecord]:
            rows = [
                replace(run, now_us=now)
                for (ns, job, _), run in state.runs.items()
                if ns == namespace and (wanted is None or job in wanted) and _due(run, now)
            ]
            rows.sort(key=lambda run: (run.slot_us, run.job))
            return rows[:limit]

        result: list[RunRecord] = yield atomic(step)
        return result

    def run_settled(
        self, namespace: str, slots: Sequence[tuple[str, int]]
    ) -> Operation[set[tuple[str, int]]]:
        def step(state: State, _now: int) -> set[tuple[str, int]]:
            found = ((job, slot, state.runs.get((namespace, job, slot))) for job, slot in slots)
            return {(job, slot) for job, slot, run in found if run and run.state != "queued"}

        result: set[tuple[str, int]] = yield atomic(step)
        return result

    def run_get(self, namespace: str, job: str, slot_us: int) -> Operation[RunRecord | None]:
        def step(state: State, now: int) -> RunRecord | None:
            run = state.runs.get((namespace, job, slot_us))
            return replace(run, now_us=now) if run is not None else None

        result: RunRecord | None = yield atomic(step)
        return result

    def run_list(self, namespace: str, job: str | None, limit: int) -> Operation[list[RunRecord]]:
        def step(state: State, now: int) -> list[RunRecord]:
            rows = [
                replace(run, now_us=now)
                for (ns, name, _), run in state.runs.items()
                if ns == namespace and (job is None or name == job)
            ]
            rows.sort(key=lambda run: (-run.slot_us, run.job))
            return rows[:limit]

        result: list[RunRecord] = yield atomic(step)
        return result

    def run_list_many(
        self, namespace: str, jobs: Sequence[str], limit: int, *, output: bool = True
    ) -> Operation[list[list[RunRecord]]]:
        def step(state: State, now: int) -> list[list[RunRecord]]:
            if limit <= 0:
                return [[] for _ in jobs]
            by_job: dict[str, list[RunRecord]] = {job: [] for job in jobs}
            for (ns, name, _), run in state.runs.items():
                if ns == namespace and name in by_job:
                    kept = run.output if output else None
                    by_job[name].append(replace(run, output=kept, now_us=now))
            for rows in by_job.values():
                rows.sort(key=lambda run: -run.slot_us)
            return [by_job[job][:limit] for job in jobs]

        result: list[list[RunRecord]] = yield atomic(step)
        return result

    def run_running(
        self, namespace: str, jobs: Sequence[str], limit: int
    ) -> Operation[list[RunRecord]]:
        def step(state: State, now: int) -> list[RunRecord]:
            if limit <= 0:
                return []
            by_job: dict[str, list[RunRecord]] = {job: [] for job in jobs}
            for (ns, name, _), run in state.runs.items():
                if ns == namespace and name in by_job:
                    by_job[name].append(run)
            found: list[RunRecord] = []
            for job in sorted(by_job):
                newest = sorted(by_job[job], key=lambda run: -run.slot_us)[:limit]
                found += (replace(r, now_us=now) for r in newest if r.state == "running")
            return found

        result: list[RunRecord] = yield atomic(step)
        return result

    def run_prune(self, namespace: str, keep: int, older_than_us: int) -> Operation[int]:
        def step(state: State, now: int) -> int:
            by_job: dict[str, list[RunRecord]] = {}
            for (ns, name, _), run in state.runs.items():
                if ns == namespace and run.state in FINAL_STATES:
                    by_job.setdefault(name, []).append(run)
            doomed = []
            for runs in by_job.values():
                runs.sort(key=lambda run: -run.slot_us)
                for index, run in enumerate(runs):
                    old = run.finished_us is not None and run.finished_us < now - older_than_us
                    if index >= keep or old:
                        doomed.append((namespace, run.job, run.slot_us))
            for key in doomed:
                del state.runs[key]
            return len(doomed)

        result: int = yield atomic(step)
        return result

    def run_prune_job(
        self,
        namespace: str,
        job: str,
        keep: int,
        older_than_us: int,
        limit: int,
        dry_run: bool = False,
    ) -> Operation[int]:
        def step(state: State, now: int) -> int:
            return _prune_job(state, namespace, job, keep, older_than_us, limit, dry_run, now)

        result: int = yield atomic(step)
        return result

    def run_prune_jobs(
        self, namespace: str, rules: Sequence[tuple[str, int, int]], limit: int
    ) -> Operation[list[int]]:
        def step(state: State, now: int) -> list[int]:
            return [
                _prune_job(state, namespace, job, keep, older_than_us, limit, False, now)
                for job, keep, older_than_us in rules
            ]

        result: list[int] = yield atomic(step)
        return result

    def job_delete(self, namespace: str, job: str, dry_run: bool = False) -> Operation[bool]:
        def step(state: State, _now: int) -> bool:
            if (namespace, job) not in state.jobs:
                return False
            if any(
                key[:2] == (namespace, job) and run.state in ("queued", "running")
                for key, run in state.runs.items()
            ):
                return False
            if not dry_run:
                del state.jobs[(namespace, job)]
            return True

        result: bool = yield atomic(step)
        return result

    def job_register(
        self, namespace: str, jobs: Sequence[tuple[str, str, str]]
    ) -> Operation[list[JobRecord | None]]:
        def step(state: State, now: int) -> list[JobRecord | None]:
            befores: list[JobRecord | None] = []
            for job, definition, fingerprint in jobs:
                before = state.jobs.get((namespace, job))
                base = before if before is not None else new_job(namespace, job, now)
                state.jobs[(namespace, job)] = replace(
                    base,
                    definition=definition,
                    fingerprint=fingerprint,
                    updated_us=now,
                    now_us=now,
                )
                befores.append(before)
            return befores

        result: list[JobRecord | None] = yield atomic(step)
        return result

    def job_set_paused(self, namespace: str, job: str, paused: bool) -> Operation[bool]:
        def step(state: State, now: int) -> bool:
            key = (namespace, job)
            before = state.jobs.get(key)
            if before is None and not paused:
                return False
            base = before if before is not None else new_job(namespace, job, now)
            row = replace(base, paused=paused, updated_us=now)
            has_runs = any(run_key[:2] == key for run_key in state.runs)
            if placeholder(row) and not paused and not has_runs:
                del state.jobs[key]
            else:
                state.jobs[key] = row
            return True

        result: bool = yield atomic(step)
        return result

    def job_get(self, namespace: str, job: str) -> Operation[JobRecord | None]:
        def step(state: State, now: int) -> JobRecord | None:
            row = state.jobs.get((namespace, job))
            return replace(row, now_us=now) if row is not None else None

        result: JobRecord | None = yield atomic(step)
        return result

    def job_list(self, namespace: str) -> Operation[list[JobRecord]]:
        def step(state: State, now: int) -> list[JobRecord]:
            rows = [replace(j, now_us=now) for (ns, _), j in state.jobs.items() if ns == namespace]
            return sorted(rows, key=lambda row: row.job)

        result: list[JobRecord] = yield atomic(step)
        return result

    def job_page(
        self, namespace: str, after: str, limit: int, *, definitions: bool = True
    ) -> Operation[list[JobRecord]]:
        def step(state: State, now: int) -> list[JobRecord]:
            names = sorted(job for (ns, job) in state.jobs if ns == namespace and job > after)
            rows = [state.jobs[namespace, job] for job in names[: max(limit, 0)]]
            if definitions:
                return [replace(row, now_us=now) for row in rows]
            return [replace(row, definition="", now_us=now) for row in rows]

        result: list[JobRecord] = yield atomic(step)
        return result

    def job_namespaces(self) -> Operation[list[str]]:
        def step(state: State, now: int) -> list[str]:
            return sorted({ns for ns, _ in state.jobs})

        result: list[str] = yield atomic(step)
        return result


def _due(run: RunRecord, now: int) -> bool:
    if run.state == "queued":
        return True
    if run.state == "running":
        return run.expires_us is not None and run.expires_us <= now
    return run.state == "failed" and run.retry_at_us is not None and run.retry_at_us <= now


def _finished(run: RunRecord) -> bool:
    """In a final state and not waiting for a retry: what retention may delete."""
    return run.state in FINAL_STATES and not (run.state == "failed" and run.retry_at_us is not None)


def _raise_high_water(state: State, namespace: str, job: str, slot_us: int, now: int) -> None:
    row = state.jobs.get((namespace, job)) or new_job(namespace, job, now)
    if row.high_water_us is None or slot_us > row.high_water_us:
        row = replace(row, high_water_us=slot_us)
    state.jobs[(namespace, job)] = row


def _record(state: State, namespace: str, note: RunNote, now: int) -> bool:
    key = (namespace, note.job, note.slot_us)
    if key in state.runs or note.slot_us > now:  # never a row for a slot not yet due
        return False
    state.runs[key] = noted_run(namespace, note, now)
    if note.state != "queued":  # a manual run is not schedule progress
        _raise_high_water(state, namespace, note.job, note.slot_us, now)
    return True


def _finish(state: State, namespace: str, finish: RunFinish, now: int) -> bool:
    """Record one outcome (:func:`decide_finish`); whether it was ours to record."""
    lease_key = (namespace, job_lease_name(finish.job))
    run_key = (namespace, finish.job, finish.slot_us)
    run, lease, job_row = decide_finish(
        run=state.runs.get(run_key),
        lease=state.leases.get(lease_key),
        job=state.jobs.get((namespace, finish.job)),
        fence=finish.fence,
        outcome=finish.outcome,
        now=now,
    )
    if run is None:
        return False
    state.runs[run_key] = run
    if lease is not None:
        state.leases[lease_key] = lease
    if job_row is not None:
        state.jobs[(namespace, finish.job)] = job_row
    return True


def _prune_job(
    state: State,
    namespace: str,
    job: str,
    keep: int,
    older_than_us: int,
    limit: int,
    dry_run: bool,
    now: int,
) -> int:
    """The retention of one job (:meth:`MemoryOperations.run_prune_job`)."""
    finished = sorted(
        (
            run
            for (ns, name, _), run in state.runs.items()
            if ns == namespace and name == job and _finished(run)
        ),
        key=lambda run: -run.slot_us,
    )
    beyond = finished[max(keep, 0) :]
    doomed = sorted(
        run.slot_us
        for run in beyond
        if run.finished_us is not None and run.finished_us < now - older_than_us
    )[: max(limit, 0)]
    if not dry_run:
        for slot_us in doomed:
            del state.runs[(namespace, job, slot_us)]
    return len(doomed)
