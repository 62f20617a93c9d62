"""The run ledger's rules, as pure functions: the reference every backend implements.

Memory and SQLite apply these functions to the rows they read inside one atomic step;
PostgreSQL (a PL/pgSQL function), MySQL (one multi-statement transaction) and Redis (a Lua
script) express the same rules in the store's language. ``tests/contract/test_ledger.py``
holds all of them to the same behaviour. The rules are spelled out in
``docs/design/ledger.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from fleetcron.models import JobRecord, LeaseRecord, RunNote, RunOutcome, RunRecord, SlotClaim

__all__ = [
    "LOST_ERROR",
    "MISSED_ERROR",
    "ClaimDecision",
    "backfill_slots",
    "backfilled_run",
    "decide_claim",
    "decide_extend",
    "decide_finish",
    "new_job",
    "noted_run",
    "placeholder",
    "recorded_run",
    "stored_text",
]

LOST_ERROR = "the holder's lease expired without an outcome"
MISSED_ERROR = "not started by its deadline"
"""The reason of a ``missed`` row, however it was recorded (a claim past its deadline, or
slots catch-up gives up); the log lines say it after "missed: ", with the job's policy."""
OUTPUT_LIMIT = 4096


def stored_text(text: str | None, *, tail: bool = False) -> str | None:
    """An outcome's error or output (``tail``: cut to its last :data:`OUTPUT_LIMIT`
    characters) as every backend stores it: a NUL character, which PostgreSQL's text cannot
    hold (a command's output may well print one), becomes U+FFFD. Without this the outcome
    of such a run could never be recorded there."""
    if not text:
        return text
    if tail:
        text = text[-OUTPUT_LIMIT:]
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


@dataclass(frozen=True, slots=True)
class ClaimDecision:
    """What a claim writes. ``run`` is the claimed attempt (``None``: not claimed);
    ``lease`` the job lease row to write; ``closed`` a run row to write without claiming
    (an expired attempt closed as ``lost``, or a late slot recorded as ``missed``);
    ``status`` the claim's answer (:data:`~fleetcron.models.CLAIM_STATUSES`)."""

    run: RunRecord | None
    lease: LeaseRecord | None
    closed: RunRecord | None
    status: str


def new_job(namespace: str, job: str, now: int) -> JobRecord:
    """A job row for a job nobody registered yet (a claim or trigger came first)."""
    return JobRecord(
        namespace=namespace,
        job=job,
        paused=False,
        definition="{}",
        fingerprint="",
        high_water_us=None,
        last_success_us=None,
        last_failure_us=None,
        updated_us=now,
        now_us=now,
    )


def placeholder(job: JobRecord) -> bool:
    """Whether the job row holds nothing but what a pause (or a claim or trigger) before
    any registration made: no definition nor fingerprint, and no progress. Resuming such a
    row that no run row names deletes it (a pause recorded ahead of a deploy, taken back)."""
    return (
        job.fingerprint == ""
        and job.definition in ("", "{}")
        and job.high_water_us is None
        and job.last_success_us is None
        and job.last_failure_us is None
    )


def recorded_run(
    *,
    namespace: str,
    job: str,
    slot_us: int,
    state: str,
    error: str | None,
    trigger: str,
    now: int,
) -> RunRecord:
    """The row ``run_record`` inserts: a slot's outcome without an attempt (skipped, missed)
    or a slot waiting to be claimed (queued)."""
    return RunRecord(
        namespace=namespace,
        job=job,
        slot_us=slot_us,
        state=state,
        attempt=0,
        fence=0,
        holder="",
        run_id="",
        trigger=trigger,
        started_us=None,
        finished_us=now,
        expires_us=None,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=error,
        output=None,
        now_us=now,
    )


def noted_run(namespace: str, note: RunNote, now: int) -> RunRecord:
    """:func:`recorded_run` of one item of ``run_record_many``."""
    return recorded_run(
        namespace=namespace,
        job=note.job,
        slot_us=note.slot_us,
        state=note.state,
        error=note.error,
        trigger=note.trigger,
        now=now,
    )


def backfill_slots(slots: Iterable[int]) -> list[int]:
    """The slots of a ``run_backfill`` as every backend writes them: each once, oldest
    first, so that two backfills of one job take its row locks in the same order (neither
    waits for the other in a cycle) and a slot named twice is counted once."""
    return sorted(set(slots))


def backfilled_run(namespace: str, job: str, slot_us: int, now: int) -> RunRecord:
    """The row ``run_backfill`` inserts: a queued run of trigger ``backfill``, as
    ``run_record`` writes a queued slot."""
    return recorded_run(
        namespace=namespace,
        job=job,
        slot_us=slot_us,
        state="queued",
        error=None,
        trigger="backfill",
        now=now,
    )


def decide_claim(
    *,
    namespace: str,
    claim: SlotClaim,
    holder: str,
    ttl_us: int,
    now: int,
    run: RunRecord | None,
    lease: LeaseRecord | None,
    job: JobRecord | None,
) -> ClaimDecision:
    """Apply the claim rules to the current rows of one slot.

    1. A slot the store's clock has not reached is never claimed.
    1b. (Checked by each store before this function, with the job row it reads: see
       :func:`fleetcron.stores.base.conflict_answer`.) A claim made for another definition
       of the job than the registered one answers ``conflict`` and writes nothing.
    2. A paused job is not claimed by its schedule (manual triggers still run).
    3. No row, or a ``queued`` row (a manual trigger or backfill): attempt 1. A ``running``
       row whose lease expired: the holder vanished —
       attempt + 1 if attempts remain, else the row is closed as ``lost``. A ``failed``
       row whose ``retry_at`` has come: attempt + 1 if attempts remain. Anything else
       (running and valid, or finished) is not claimed: a finished slot never runs again.
    4. No row, and the claim's deadline has passed: the slot is recorded as ``missed``.
    5. Exclusive claims need the job lease free at ``now`` and take it; every claim moves
       the job's fence to ``max(previous + 1, now)``.

    The answer's ``status`` names the first rule that refused: ``not_due`` (1), ``paused``
    (2), ``taken`` (3: the row cannot be claimed, including a row just closed as lost),
    ``missed`` (4), ``busy`` (5), else ``claimed``.
    """
    if claim.slot_us > now:
        return _refused("not_due")
    if job is not None and job.paused and claim.pausable:
        return _refused("paused")
    attempt = 1
    note: str | None = None
    if run is not None:
        expired = run.expires_us is not None and run.expires_us <= now
        if run.state == "running" and expired:
            if run.attempt >= claim.max_attempts:
                closed = replace(
                    run,
                    state="lost",
                    finished_us=now,
                    expires_us=None,
                    error=LOST_ERROR,
                    now_us=now,
                )
                return ClaimDecision(run=None, lease=None, closed=closed, status="taken")
            attempt, note = run.attempt + 1, f"attempt {run.attempt} lost: {LOST_ERROR}"
        elif run.state == "queued":
            attempt = 1  # asked for by `fleetcron trigger` / backfill: the first attempt
        elif (
            run.state == "failed"
            and run.retry_at_us is not None
            and run.retry_at_us <= now
            and run.attempt < claim.max_attempts
        ):
            attempt = run.attempt + 1
        else:
            return _refused("taken")
    elif claim.deadline_us is not None and now > claim.deadline_us:
        missed = recorded_run(
            namespace=namespace,
            job=claim.job,
            slot_us=claim.slot_us,
            state="missed",
            error=MISSED_ERROR,
            trigger=claim.trigger,
            now=now,
        )
        return ClaimDecision(run=None, lease=None, closed=missed, status="missed")
    if claim.exclusive and lease is not None and lease.expires_us > now:
        return _refused("busy")
    fence = max(lease.fence + 1 if lease is not None else 0, now)
    if claim.exclusive:
        new_lease = LeaseRecord(
            namespace=namespace,
            name=lease.name if lease is not None else "",
            holder=holder,
            fence=fence,
            acquired_us=now,
            expires_us=now + ttl_us,
            min_until_us=now + claim.least_us,
            now_us=now,
        )
    elif lease is not None:
        new_lease = replace(lease, fence=fence, now_us=now)
    else:
        new_lease = LeaseRecord(
            namespace=namespace,
            name="",
            holder="",
            fence=fence,
            acquired_us=0,
            expires_us=0,
            min_until_us=0,
            now_us=now,
        )
    claimed = RunRecord(
        namespace=namespace,
        job=claim.job,
        slot_us=claim.slot_us,
        state="running",
        attempt=attempt,
        fence=fence,
        holder=holder,
        run_id=claim.run_id,
        trigger=claim.trigger,
        started_us=now,
        finished_us=None,
        expires_us=now + ttl_us,
        retry_at_us=None,
        cancel_requested=False,
        exit_code=None,
        error=note,
        output=None,
        now_us=now,
    )
    return ClaimDecision(run=claimed, lease=new_lease, closed=None, status="claimed")


def _refused(status: str) -> ClaimDecision:
    return ClaimDecision(run=None, lease=None, closed=None, status=status)


def decide_extend(
    *, run: RunRecord | None, lease: LeaseRecord | None, fence: int, ttl_us: int, now: int
) -> tuple[RunRecord | None, LeaseRecord | None]:
    """Renew a running attempt held with ``fence`` (and the job lease if it carries the
    same fence). Nothing changes unless the attempt is running, ours and unexpired."""
    if not _ours(run, fence, now):
        return None, None
    assert run is not None
    renewed = replace(run, expires_us=now + ttl_us, now_us=now)
    new_lease = None
    if lease is not None and lease.fence == fence and lease.expires_us > now:
        new_lease = replace(lease, expires_us=max(now + ttl_us, lease.min_until_us), now_us=now)
    return renewed, new_lease


def decide_finish(
    *,
    run: RunRecord | None,
    lease: LeaseRecord | None,
    job: JobRecord | None,
    fence: int,
    outcome: RunOutcome,
    now: int,
) -> tuple[RunRecord | None, LeaseRecord | None, JobRecord | None]:
    """Record an attempt's outcome — only while it is running, ours and unexpired: a
    holder that was paused past its lease has its late completion refused (fencing)."""
    if not _ours(run, fence, now):
        return None, None, None
    assert run is not None
    retry_at = None
    if outcome.state == "failed" and outcome.retry_after_us is not None:
        retry_at = now + outcome.retry_after_us
    finished = replace(
        run,
        state=outcome.state,
        finished_us=now,
        expires_us=None,
        retry_at_us=retry_at,
        exit_code=outcome.exit_code,
        error=stored_text(outcome.error),
        output=stored_text(outcome.output, tail=True),
        now_us=now,
    )
    released = None
    if lease is not None and lease.fence == fence:
        released = replace(lease, expires_us=max(now, lease.min_until_us), now_us=now)
    base = job if job is not None else new_job(run.namespace, run.job, now)
    updated = replace(
        base,
        last_success_us=now if outcome.state == "succeeded" else base.last_success_us,
        last_failure_us=now if outcome.state in ("failed", "lost") else base.last_failure_us,
        now_us=now,
    )
    return finished, released, updated


def _ours(run: RunRecord | None, fence: int, now: int) -> bool:
    return (
        run is not None
        and run.state == "running"
        and run.fence == fence
        and run.expires_us is not None
        and run.expires_us > now
    )
