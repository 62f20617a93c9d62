"""Supervision: running one claimed attempt, from its start to its recorded outcome.

Each attempt holds its slot like a lease (:class:`~fleetcron.slot_lease.AsyncSlotLease`):
renewed every ``lock_at_most / 3`` while ``keepalive`` is on, its loss (or its timeout, a
cancel request, the replica's shutdown) stops the run with the executor's stop sequence,
and its outcome is recorded only while its fence is current. A sync function that does not
return when cancelled is *abandoned*: no other run of its job starts on this replica until
it returns (the loop asks :attr:`Supervisor.abandoned`). A job with a ``ping_url`` has
each attempt's start and end pinged in the background (:mod:`fleetcron.pings`).

A run in a process (a command, ``isolate = "process"``) is also watched by the replica's
reaper (:mod:`fleetcron.reaper`, one process per replica, started with its first such
run and closed when the replica has drained): it stops the run's process group at the
lease's deadline when the replica is frozen, and at once when the replica has died.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetcron._log import log
from fleetcron.checkpoint import Checkpoint
from fleetcron.clock import Clock, SystemClock
from fleetcron.context import RunContext
from fleetcron.errors import StoreError, StoreReplaced
from fleetcron.executor import Cancellation, StopPolicy, execute
from fleetcron.jobspec import CommandTarget, JobSpec
from fleetcron.keepalive import effective_grace_us
from fleetcron.lease import LeaseTerms
from fleetcron.metrics import Metrics
from fleetcron.models import RunOutcome, RunRecord
from fleetcron.pings import AsyncPinger, finish_ping, start_ping
from fleetcron.queue import AsyncQueue, JobQueue
from fleetcron.reaper import Reaper
from fleetcron.schedules import iso_utc
from fleetcron.scheduling.cancels import CancelWatch
from fleetcron.scheduling.finishing import FinishBatcher
from fleetcron.scheduling.recovery import Recovery
from fleetcron.scrub import scrubber_for
from fleetcron.slot_lease import AsyncSlotLease
from fleetcron.stores.base import AsyncStore

__all__ = ["ABANDONED_REASON", "Running", "Supervisor", "SupervisorOptions"]

ABANDONED_REASON = "an abandoned run of this job still runs on this replica"


@dataclass(frozen=True, kw_only=True)
class SupervisorOptions:
    """What supervision needs of the replica's options."""

    namespace: str
    kill_grace_s: float
    shutdown_grace_s: float
    backend_url: str | None
    echo: bool


@dataclass(eq=False)
class Running:
    """One attempt in flight on this replica."""

    spec: JobSpec
    record: RunRecord
    cancellation: Cancellation
    task: asyncio.Task[None] | None = None

    @property
    def stopping(self) -> bool:
        """Whether the attempt is being stopped already (for any reason)."""
        return self.cancellation.reason is not None

    def cancel(self, reason: str) -> None:
        """A cancel request reached the attempt (its row, read by the cancel watch or a
        renewal): stop it, recording ``reason``; said once."""
        if self.stopping:
            return
        record = self.record
        log.info(
            "%s: stopping the run of slot %s (fence %d): %s",
            record.job,
            iso_utc(record.slot_us),
            record.fence,
            reason,
            extra={"action": "run_cancel_received", "job": record.job, "fence": record.fence},
        )
        self.cancellation.request(reason)


class Supervisor:
    """The attempts in flight on one replica, and the jobs blocked by an abandoned run."""

    def __init__(
        self,
        store: AsyncStore,
        specs: Mapping[str, JobSpec],
        options: SupervisorOptions,
        *,
        clock: Clock,
        recovery: Recovery,
        store_now: Callable[[], int],
        on_done: Callable[[], None],
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.specs = specs
        self.options = options
        self.clock = clock
        self.recovery = recovery
        self._store_now = store_now
        self._on_done = on_done
        self.running: dict[tuple[str, int], Running] = {}
        # Jobs whose sync function was abandoned after its cancellation and still runs.
        self.abandoned: dict[str, asyncio.Future[object]] = {}
        # Jobs with an attempt whose run has ended and whose outcome is not recorded yet:
        # their next exclusive slot is not claimed before it is (the store would find the
        # job still running and the slot would be skipped behind this replica's own run).
        self.finishing: dict[str, int] = {}
        self._store_back = asyncio.Event()
        self.pings = AsyncPinger()
        self.finisher = FinishBatcher(store, options.namespace)
        # The reaper's stop points are CLOCK_MONOTONIC instants: a test's fake clock has
        # none to give it.
        self.reaper = Reaper() if Reaper.supported() and isinstance(clock, SystemClock) else None
        self.cancels = CancelWatch(store, options.namespace, lambda: self.running)

    def store_answered(self) -> None:
        """The store answers again after failing: outcomes waiting for their next try are
        sent now rather than at the end of their back-off."""
        self._store_back.set()
        self._store_back = asyncio.Event()

    def start(self, record: RunRecord, sent_us: int) -> None:
        """Run a claimed attempt; ``sent_us``: when its claim was sent (its lease's start)."""
        spec = self.specs[record.job]
        entry = Running(spec=spec, record=record, cancellation=Cancellation(self.clock))
        self.running[(record.job, record.slot_us)] = entry
        if self.metrics is not None:
            self.metrics.in_flight.set(len(self.running))
        entry.task = asyncio.create_task(
            self._run_one(entry, sent_us), name=f"fleetcron-run:{record.job}"
        )
        self.cancels.wake()

    def _slot_lease(self, entry: Running, sent_us: int) -> AsyncSlotLease:
        """The run's lease: renewed (keepalive = true), its loss stops the run."""
        spec, record = entry.spec, entry.record
        terms = LeaseTerms(
            namespace=self.options.namespace,
            name=spec.name,
            lock_at_most_us=spec.lock_at_most_us,
            lock_at_least_us=spec.lock_at_least_us,
            keepalive=spec.keepalive,
        )
        lease = AsyncSlotLease(
            self.store,
            terms,
            record,
            sent_us=sent_us,
            clock=self.clock,
            on_cancel=entry.cancel,
            # With the outcomes of the other runs ending now: one round trip for them all.
            recorder=self.finisher.finish,
        )
        lease.on_lost(lambda _lease: entry.cancellation.request("lease lost"))
        if spec.keepalive:
            lease.start_keepalive()
        return lease

    def _stop_policy(self, spec: JobSpec, lease: AsyncSlotLease) -> StopPolicy:
        in_process = isinstance(spec.target, CommandTarget) or spec.isolate == "process"
        return StopPolicy(
            deadline=lambda: lease.deadline_us,
            deadline_reason="lease lost" if spec.keepalive else "lock_at_most elapsed",
            grace_us=effective_grace_us(
                round(self.options.kill_grace_s * 1e6), spec.lock_at_most_us
            ),
            clock=self.clock,
            reaper=self.reaper if in_process else None,
            # A renewal moves the deadline: the reaper is told at once, not at the old stop
            # point, where it would be deciding too.
            moved=lease.renewed,
        )

    async def _run_one(self, entry: Running, sent_us: int) -> None:
        spec, record = entry.spec, entry.record
        ns = self.options.namespace
        adapter = logging.LoggerAdapter(
            logging.getLogger(f"fleetcron.job.{spec.name}"),
            {"job": spec.name, "slot_us": record.slot_us, "fence": record.fence},
        )
        loop = asyncio.get_running_loop()  # where the store is: a job's thread calls back here
        ctx = RunContext(
            job=spec.name,
            namespace=ns,
            slot_us=record.slot_us,
            fence=record.fence,
            attempt=record.attempt,
            run_id=record.run_id,
            trigger=record.trigger,
            logger=adapter,
            _checkpoint=Checkpoint(self.store, ns, spec.name, record.fence, loop),
            _queues=lambda name, settings: JobQueue(
                AsyncQueue(self.store, ns, name, settings), loop
            ),
        )
        log.info(
            "%s: run started (slot %s, attempt %d, fence %d)",
            spec.name,
            iso_utc(record.slot_us),
            record.attempt,
            record.fence,
            extra={"action": "run_started", "job": spec.name, "fence": record.fence},
        )
        if spec.ping_url is not None:
            self.pings.send(start_ping(spec.name, spec.ping_url, record.run_id))
        lease = self._slot_lease(entry, sent_us)
        timer = None
        if spec.timeout_us is not None:
            timer = asyncio.get_running_loop().call_later(
                spec.timeout_us / 1e6, entry.cancellation.request, "timeout"
            )
        started_us = self.clock.monotonic_us()
        try:
            execution = await execute(
                spec,
                ctx,
                entry.cancellation,
                self._stop_policy(spec, lease),
                backend_url=self.options.backend_url,
                echo=self.options.echo,
            )
            outcome = execution.outcome
            if execution.abandoned is not None:
                self._abandon(spec.name, execution.abandoned)
        except Exception as exc:  # the executor itself failed: still record it
            error = scrubber_for(self.options.backend_url).scrub(f"{type(exc).__name__}: {exc}")
            outcome = RunOutcome(state="failed", error=error)
        except BaseException:
            # Cancelled (the replica's shutdown) before an outcome: the lease must not go on
            # renewing a run that no longer exists; it expires and the ledger recovers it.
            lease.cancel_keepalive()
            self._release(entry)
            stopped = RunOutcome(state="lost", error="the replica stopped before the run ended")
            self._ping_finish(entry, stopped, None)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        accepted: bool | None = None
        ran_s = (self.clock.monotonic_us() - started_us) / 1e6
        job = spec.name
        self.finishing[job] = self.finishing.get(job, 0) + 1
        try:
            accepted = await self._finish(entry, lease, outcome)
        except Exception:
            # Not a store outage (_finish logs those): a bug or an outcome the store cannot
            # take. The row stays running until its lease expires and is recovered.
            log.exception(
                "%s: recording the outcome failed",
                spec.name,
                extra={"action": "run_finish_failed", "job": spec.name},
            )
        finally:
            if self.finishing[job] == 1:
                del self.finishing[job]
            else:
                self.finishing[job] -= 1
            if self.metrics is not None:
                # As the ledger has it: an outcome it refused was a lost lease.
                final = "lost" if accepted is False else outcome.state
                self.metrics.finished(spec.name, final, ran_s)
            self._ping_finish(entry, outcome, accepted)
            self._release(entry)
            self._on_done()

    def _release(self, entry: Running) -> None:
        """The attempt is no longer in flight on this replica."""
        self.running.pop((entry.record.job, entry.record.slot_us), None)
        if self.metrics is not None:
            self.metrics.in_flight.set(len(self.running))

    def _ping_finish(self, entry: Running, outcome: RunOutcome, accepted: bool | None) -> None:
        """Ping the attempt's end (``accepted``: whether the ledger took its outcome,
        ``None``: unknown). A refused outcome was a lost lease; a failure that will be
        retried is only logged; a command stopped by fleetcron (timeout, cancel, lease
        lost) is a ``/fail``, not its signal's status."""
        spec, record = entry.spec, entry.record
        if spec.ping_url is None:
            return
        if accepted is False:
            outcome = RunOutcome(
                state="lost",
                error=f"outcome refused: fence {record.fence} is no longer current (lease lost)",
                output=outcome.output,
            )
        stopped = entry.cancellation.reason is not None
        command = isinstance(spec.target, CommandTarget)
        ping = finish_ping(
            spec.name,
            spec.ping_url,
            record.run_id,
            outcome,
            exit_status=outcome.exit_code if command and not stopped else None,
            retrying=bool(accepted)
            and outcome.state == "failed"
            and record.attempt <= spec.retries,
        )
        self.pings.send(ping)

    def _abandon(self, job: str, work: asyncio.Future[object]) -> None:
        """A sync function did not return when its run was cancelled: it still runs in its
        thread. No other run of the job starts here until it returns."""
        log.error(
            "%s: the function did not return after its run was cancelled; it still runs "
            "in its thread, and no other run of %s starts on this replica until it returns "
            '(check ctx.cancelled, or set isolate = "process")',
            job,
            job,
            extra={"action": "run_abandoned", "job": job},
        )
        self.abandoned[job] = work

        def ended(_: asyncio.Future[object]) -> None:
            if self.abandoned.get(job) is work:
                del self.abandoned[job]
            log.warning(
                "%s: the abandoned run returned; the job runs again",
                job,
                extra={"action": "run_abandoned_ended", "job": job},
            )
            self._on_done()

        work.add_done_callback(ended)

    async def _finish(
        self, entry: Running, lease: AsyncSlotLease, outcome: RunOutcome
    ) -> bool | None:
        """Record ``outcome``; whether the ledger took it (``None``: the store failed)."""
        spec, record = entry.spec, entry.record
        retry = outcome.state == "failed" and record.attempt <= spec.retries
        if retry:
            outcome = RunOutcome(
                state=outcome.state,
                exit_code=outcome.exit_code,
                error=outcome.error,
                output=outcome.output,
                retry_after_us=spec.retry_backoff_us,
            )

        def retrying(error: StoreError) -> None:
            log.warning(
                "%s: could not record the outcome %s yet (%s); trying again until the lease ends",
                spec.name,
                outcome.state,
                error,
                extra={"action": "run_finish_retrying", "job": spec.name},
            )

        try:
            accepted = await lease.finish(outcome, on_retry=retrying, wake=lambda: self._store_back)
        except StoreReplaced as exc:
            log.warning(
                "%s: outcome %s not recorded: %s",
                spec.name,
                outcome.state,
                exc,
                extra={"action": "run_finish_failed", "job": spec.name},
            )
            return None
        except StoreError as exc:
            log.error(
                "%s: could not record the outcome %s before the lease ended (%s); the "
                "ledger recovers the slot as a vanished attempt: run again (attempt %d) if "
                "retries remain, else recorded lost",
                spec.name,
                outcome.state,
                exc,
                record.attempt + 1,
                extra={"action": "run_finish_failed", "job": spec.name},
            )
            return None
        if not accepted:
            log.error(
                "%s: outcome %s refused: fence %d is no longer current (lease lost)",
                spec.name,
                outcome.state,
                record.fence,
                extra={"action": "run_rejected", "job": spec.name, "fence": record.fence},
            )
            return False
        if retry:
            due = self._store_now() + spec.retry_backoff_us
            self.recovery.schedule_retry(spec.name, record.slot_us, due, record.attempt + 1)
        level = logging.INFO if outcome.state == "succeeded" else logging.WARNING
        log.log(
            level,
            "%s: run %s%s",
            spec.name,
            outcome.state,
            f" ({outcome.error})" if outcome.error else "",
            extra={
                "action": f"run_{outcome.state}",
                "job": spec.name,
                "fence": record.fence,
                "exit_code": outcome.exit_code,
            },
        )
        return True

    def cancel_all(self, reason: str) -> None:
        """Ask every run in flight to stop."""
        for entry in self.running.values():
            entry.cancellation.request(reason)

    async def wait_runs(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the runs in flight to end."""
        tasks = [e.task for e in self.running.values() if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def drain(self) -> None:
        """Shutdown: the runs get ``shutdown_grace_s`` to end, then are stopped; their
        pings get :data:`~fleetcron.pings.CLOSE_WAIT_S` to go out."""
        if self.running:
            log.info(
                "stopping: waiting up to %.0fs for %d run(s)",
                self.options.shutdown_grace_s,
                len(self.running),
                extra={"action": "scheduler_draining"},
            )
            await self.wait_runs(self.options.shutdown_grace_s)
        if self.running:
            self.cancel_all("replica shutting down")
            await self.wait_runs(self.options.kill_grace_s + 2)
        cancelled = [e.task for e in self.running.values() if e.task is not None]
        for task in cancelled:
            task.cancel()
        if cancelled:  # their last pings are queued as they unwind
            await asyncio.wait(cancelled, timeout=1)
        await self.cancels.close()
        if self.reaper is not None:
            # Every run has ended (each told the reaper): it exits as its pipe closes.
            await asyncio.to_thread(self.reaper.close)
        await self.pings.close()
