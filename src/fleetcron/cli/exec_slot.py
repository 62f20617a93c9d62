"""``fleetcron exec --schedule``: the run is a slot of the run ledger.

The run counts for the latest slot of the schedule the store's clock has reached (a
trigger a little early waits for its slot), claimed once across every host and every
duplicate trigger; its outcome is recorded in the ledger while its fence is current. The
job's definition — the :class:`~fleetcron.jobspec.JobSpec` the options amount to
(:func:`exec_job_spec`) — is registered before each claim, so ``fleetcron status`` and the
watching replica judge the job by its schedule (overdue, stuck) like a job of a jobs file.
"""

from __future__ import annotations

import json
import time
import uuid

from fleetcron._log import log
from fleetcron.cli.exec_command import run_command, run_outcome
from fleetcron.cli.exec_options import ExecOptions
from fleetcron.cli.exec_pings import RunPings
from fleetcron.cli.exitcodes import EXIT_LEASE_LOST, EXIT_STORE_UNAVAILABLE
from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.durations import to_micros
from fleetcron.errors import ConfigurationError, StoreError
from fleetcron.jobspec import DEFAULTS, CommandTarget, JobSpec
from fleetcron.lease import LeaseTerms, new_holder
from fleetcron.lock_terms import lease_terms
from fleetcron.models import JobRecord, RunOutcome, SlotClaim
from fleetcron.schedules import CronSchedule, Schedule, iso_utc, schedule_from_definition
from fleetcron.scrub import Scrubber
from fleetcron.slot_lease import SlotLease
from fleetcron.stores.base import SyncStore

__all__ = ["exec_job_spec", "latest_slot", "run_exec_schedule"]


# A cron daemon whose clock runs a little fast fires before the store reaches the slot:
# wait for it rather than counting the run for the previous (already run) slot.
_EARLY_TOLERANCE_US = 10_000_000
_LOOKBACK_US = (60, 3_600, 86_400, 8 * 86_400, 32 * 86_400, 367 * 86_400, 1_462 * 86_400)


def latest_slot(schedule: Schedule, now_us: int) -> int | None:
    """The latest slot of ``schedule`` at or before ``now_us`` (None if there is none)."""
    for seconds in _LOOKBACK_US:
        slots = schedule.slots_between(now_us - seconds * 1_000_000, now_us, limit=100_000)
        if slots:
            return slots[-1]
    return None


def _default_us(key: str) -> int:
    value = DEFAULTS[key]
    assert isinstance(value, str)  # a duration key with a default
    return to_micros(value, what=key)


def exec_job_spec(
    options: ExecOptions, schedule: Schedule, terms: LeaseTerms, backend_url: str | None
) -> JobSpec:
    """The job definition an ``exec --schedule`` invocation amounts to: what it registers.

    It is the definition a ``[jobs.NAME]`` table with the same ``schedule``, ``timezone``,
    ``command``, ``lock_at_most``, ``lock_at_least``, ``timeout``, ``keepalive``,
    ``ping_url``, ``grace`` and ``stuck_after``, and ``overlap = "skip"``, ``catchup =
    "skip"`` gets — the other keys at their defaults (no retries, no jitter) — so a replica
    defining the job that way agrees with the crontab line. Nothing is checked here beyond
    what :func:`exec_options` and ``lease_terms`` checked: registering must not refuse
    an invocation that ran before. The command's arguments are stored with the store's
    password masked (:class:`~fleetcron.scrub.Scrubber`), as a run's output is: a shell
    that expanded ``$FLEETCRON_BACKEND`` into them must not leave it in the job row.
    """
    scrubber = Scrubber(backend_url)
    max_catchup = DEFAULTS["max_catchup"]
    assert isinstance(max_catchup, int)
    return JobSpec(
        name=options.name,
        schedule=schedule,
        timezone=schedule.timezone if isinstance(schedule, CronSchedule) else "UTC",
        target=CommandTarget(tuple(scrubber.scrub(arg) for arg in options.command)),
        lock_at_most_us=terms.lock_at_most_us,
        lock_at_least_us=terms.lock_at_least_us,
        timeout_us=options.timeout_us,
        overlap="skip",  # a slot whose previous run still holds the job is skipped
        catchup="skip",  # cron fires each slot; nothing runs a missed one later
        catchup_window_us=_default_us("catchup_window"),
        max_catchup=max_catchup,
        retries=0,  # the claim allows one attempt (max_attempts=1)
        retry_backoff_us=_default_us("retry_backoff"),
        jitter_us=0,
        grace_us=options.grace_us,
        ping_url=options.ping_url,
        keepalive=options.keepalive,
        stuck_after_us=options.stuck_after_us,
    )


def _register(
    store: SyncStore, namespace: str, spec: JobSpec, fingerprint: str
) -> JobRecord | None:
    """Write ``spec`` as the job's registered definition (one round trip), and say so at
    warning level when it replaced a different one; returns the row as it was."""
    stored = json.dumps(spec.definition(), sort_keys=True)
    (before,) = store.run(store.ops.job_register(namespace, [(spec.name, stored, fingerprint)]))
    if before is not None and before.fingerprint not in ("", fingerprint):
        _say_replaced(spec, stored, fingerprint, before)
    return before


def _say_replaced(spec: JobSpec, stored: str, fingerprint: str, before: JobRecord) -> None:
    # Two crontab lines (or a crontab line and a jobs file) defining one name differently
    # take turns replacing each other's definition, and status follows whichever ran last:
    # said at warning level, so it reaches the cron mail of every line involved.
    mine: dict[str, object] = json.loads(stored)
    try:
        loaded = json.loads(before.definition)
    except ValueError:
        loaded = None
    theirs: dict[str, object] = loaded if isinstance(loaded, dict) else {}
    differs = sorted(
        _key_name(key) for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)
    )
    log.warning(
        "job %s: this definition (%s, %s) replaced a different one (%s, %s; differs in: %s) "
        "registered at %s — by this line before it was changed, another `fleetcron exec "
        "--schedule` line, or a replica's jobs file. While both are in use each registration "
        "replaces the other and status follows the latest: give each its own name, or make "
        "them agree",
        spec.name,
        spec.schedule.describe(),
        fingerprint[:12],
        _describe_schedule(theirs.get("schedule")),
        before.fingerprint[:12],
        ", ".join(differs) or "-",
        iso_utc(before.updated_us),
        extra={
            "action": "job_definition_conflict",
            "job": spec.name,
            "local_fingerprint": fingerprint,
            "replaced_fingerprint": before.fingerprint,
            "differs": ",".join(differs),
        },
    )


def _key_name(key: str) -> str:
    """A definition key as the jobs file names it (``lock_at_most_us`` → ``lock_at_most``)."""
    return "command" if key == "target" else key.removesuffix("_us")


def _describe_schedule(definition: object) -> str:
    if isinstance(definition, dict):
        try:
            return schedule_from_definition(definition).describe()
        except (ConfigurationError, KeyError, TypeError, ValueError):
            pass
    return "no readable schedule"


# Why a slot was not claimed (fleetcron.models.CLAIM_STATUSES), for the log line.
_NOT_CLAIMED = {
    "taken": "it already ran or is running",
    "busy": "a run of an earlier slot still holds the job's lease",
    "paused": "the job is paused",
    "not_due": "the store's clock has not reached it",
}


def run_exec_schedule(
    store: SyncStore,
    namespace: str,
    options: ExecOptions,
    schedule: Schedule,
    backend_url: str | None,
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> int:
    """``exec --schedule``: run the command for the latest slot the store's clock has
    reached, once across every host and every duplicate trigger."""
    ledger = store.ops
    terms = lease_terms(
        namespace,
        options.name,
        lock_at_most=options.lock_at_most,
        lock_at_least=options.lock_at_least,
        keepalive=options.keepalive,
    )
    spec = exec_job_spec(options, schedule, terms, backend_url)
    fingerprint = spec.fingerprint()
    now = store.run(ledger.store_now())
    upcoming = schedule.next_after(now)
    if upcoming is not None and upcoming - now <= _EARLY_TOLERANCE_US:
        time.sleep((upcoming - now) / 1e6)
        now = store.run(ledger.store_now())
    # Registered on every invocation, just before the claim: status then knows the job's
    # schedule (overdue, stuck), and the row stays fresh for `prune --jobs` even on hosts
    # whose invocations are all skipped.
    _register(store, namespace, spec, fingerprint)
    slot = latest_slot(schedule, now)
    if slot is None:
        log.info(
            "%s: the schedule has no slot yet; nothing to run",
            options.name,
            extra={"action": "slot_skipped", "job": options.name},
        )
        return options.skipped_exit_code
    claim = SlotClaim(
        job=options.name,
        slot_us=slot,
        run_id=str(uuid.uuid4()),
        exclusive=True,
        max_attempts=1,
        trigger="exec",
        least_us=terms.lock_at_least_us,
        # Another definition registered between ours and this claim is refused (conflict).
        fingerprint=fingerprint,
    )
    sent = clock.monotonic_us()
    (answer,) = store.run(ledger.run_claim(namespace, [claim], new_holder(), terms.lock_at_most_us))
    slot_text = iso_utc(slot)
    if answer.status == "conflict":
        stored = answer.stored_fingerprint or "?"
        log.warning(
            "%s: slot %s skipped: another definition of the job (%s) was registered between "
            "this one (%s) and the claim — by another `fleetcron exec --schedule` line or a "
            "replica's jobs file; give each its own name, or make them agree",
            options.name,
            slot_text,
            stored[:12],
            fingerprint[:12],
            extra={
                "action": "job_definition_conflict",
                "job": options.name,
                "slot_us": slot,
                "status": answer.status,
                "local_fingerprint": fingerprint,
                "stored_fingerprint": stored,
            },
        )
        return options.skipped_exit_code
    if answer.run is None:
        # A ledger fact, shown at the default level (-q hides it): every host of a fleet
        # but one sees it for each slot, and a slot that is never run shows up here.
        log.warning(
            "%s: slot %s skipped: %s",
            options.name,
            slot_text,
            _NOT_CLAIMED.get(answer.status, answer.status),
            extra={
                "action": "slot_skipped",
                "job": options.name,
                "slot_us": slot,
                "status": answer.status,
            },
        )
        return options.skipped_exit_code
    run = answer.run
    pings = RunPings(options, run.run_id)
    pings.start()
    lease = SlotLease(store, terms, run, sent_us=sent, clock=clock)
    if terms.keepalive:
        lease.start_keepalive()
    lease.start_cancel_watch()  # `fleetcron cancel` reaches the command within a second
    status: int | None = None
    try:
        status = run_command(
            lease,
            options,
            backend_url,
            run_id=run.run_id,
            extra_env={"FLEETCRON_SLOT": slot_text, "FLEETCRON_ATTEMPT": str(run.attempt)},
        )
    finally:

        def retrying(error: StoreError) -> None:
            log.warning(
                "%s: could not record the outcome yet (%s); trying again until the lease ends",
                options.name,
                error,
                extra={"action": "run_finish_retrying", "job": options.name},
            )

        # The command's output is passed through, not stored; what is stored is scrubbed
        # all the same (fleetcron.scrub), as the daemon's outcomes are.
        ended = run_outcome(status, lease.cancel_requested, options, lease.cancel_reason)
        outcome = Scrubber(backend_url).outcome(ended)
        try:
            lease.finish(outcome, on_retry=retrying)
        except Exception as error:
            log.warning(
                "%s: could not record the outcome before the lease ended: %s (the ledger "
                "recovers the slot as a vanished attempt)",
                options.name,
                error,
                extra={"action": "run_finish_failed", "job": options.name},
            )
        if lease.accepted is False:
            outcome = RunOutcome(
                state="lost",
                error=f"outcome refused: fence {lease.fence} is no longer current (lease lost)",
            )
        pings.finish(outcome)
    if lease.accepted is False:
        log.error(
            "%s: outcome refused: fence %d is no longer current (lease lost)",
            options.name,
            lease.fence,
            extra={"action": "run_rejected", "job": options.name, "fence": lease.fence},
        )
        return EXIT_LEASE_LOST
    if lease.accepted is None and status is not None and status != EXIT_LEASE_LOST:
        return EXIT_STORE_UNAVAILABLE  # the command ran; its outcome could not be recorded
    return status
