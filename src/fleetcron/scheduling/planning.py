"""Planning: which slots a replica claims, and when.

Each job's next fire time (slot + jitter) sits in a heap, so a pass looks only at the jobs
that are due — its cost follows the work due, not the number of jobs defined. A due job's
slots since its cursor are split by the job's catch-up policy into the ones to claim and the
ones recorded ``missed``; every claim carries a deadline past which the store records the
slot ``missed`` instead of running it late.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetcron.jobspec import JobSpec
from fleetcron.models import SlotClaim
from fleetcron.schedules import jitter_us

__all__ = [
    "LATE_TOLERANCE_US",
    "MISSED_RECORD_LIMIT",
    "DueHeap",
    "Plan",
    "PlannedJob",
    "claim_for",
    "deadline",
    "plan_slots",
]

LATE_TOLERANCE_US = 5_000_000
"""A slot is *on time* while no newer slot has come due and it is at most this late
(plus its jitter); every other slot due is *late*, and the job's catch-up policy decides
whether it runs. One rule for every policy."""
MISSED_RECORD_LIMIT = 1_000  # missed slots recorded per job per pass (the newest)


@dataclass(eq=False, slots=True)
class PlannedJob:
    """A job as one replica plans it: ``cursor_us`` is its last slot collected (or the
    fleet's high-water mark at start); ``buffered`` the newest slot waiting for the running
    attempt to end (``overlap = buffer_one`` / ``cancel_other``); ``draining`` the newest
    slot of a caught-up backlog still being worked through (slots that come due meanwhile
    join it instead of being skipped behind it); ``resumed`` whether it resumed from the
    fleet's last slot and has not been collected since (its missed slots came due while no
    replica ran); ``next`` what the
    scheduler worked out for its next slot when it went in the heap (its own, for the
    pass that collects the slot)."""

    spec: JobSpec
    cursor_us: int
    buffered: int | None = None
    draining: int | None = None
    resumed: bool = False
    next: object = None


@dataclass
class DueHeap:
    """Each job's next fire time (slot + jitter), soonest first.

    ``delay(job, slot)`` says how long after its fire time the job's next slot may be
    collected (0: at once). A job whose next slot waits goes in a second heap, at its fire time plus
    the delay: the scheduler collects those in batches (``pop_later``), so a replica does
    not wake for every slot another replica owns."""

    delay: Callable[[PlannedJob, int], int] | None = None
    _heap: list[tuple[int, str]] = field(default_factory=list)
    _later: list[tuple[int, str]] = field(default_factory=list)

    def push(self, job: PlannedJob) -> None:
        """Put the job's next slot after its cursor, with its jitter, in a heap."""
        spec = job.spec
        following = spec.schedule.next_after(job.cursor_us)
        if following is not None:
            fire = following + jitter_us(spec.name, following, spec.jitter_us)
            wait = self.delay(job, following) if self.delay is not None else 0
            if wait > 0:
                heapq.heappush(self._later, (fire + wait, spec.name))
            else:
                heapq.heappush(self._heap, (fire, spec.name))

    def pop_due(self, now_us: int) -> list[str]:
        """The names of the jobs whose next fire time has come (they leave the heap)."""
        return _pop(self._heap, now_us)

    def pop_later(self, now_us: int) -> list[str]:
        """The names of the waiting jobs whose delay has passed (they leave the heap)."""
        return _pop(self._later, now_us)

    def soonest(self) -> int | None:
        """The next fire time of any job collected at once."""
        return self._heap[0][0] if self._heap else None

    def soonest_later(self) -> int | None:
        """When the next waiting job may be collected."""
        return self._later[0][0] if self._later else None


def _pop(heap: list[tuple[int, str]], now_us: int) -> list[str]:
    due = []
    while heap and heap[0][0] <= now_us:
        due.append(heapq.heappop(heap)[1])
    return due


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a due job's slots: ``take`` (claim, oldest first), ``missed``
    (record as missed), ``caught_up`` (the late ones taken: they run one after another,
    never "skipped while the previous one runs"), ``ready`` (all the slots collected)."""

    take: list[int]
    missed: list[int]
    caught_up: list[int]
    ready: list[int]


def plan_slots(job: PlannedJob, now_us: int) -> Plan:
    """Split the job's slots between its cursor and ``now_us`` by its catch-up policy."""
    spec = job.spec
    due = spec.schedule.slots_between(job.cursor_us, now_us, limit=100_000)
    if len(due) == 1 and not spec.jitter_us and now_us - due[0] <= LATE_TOLERANCE_US:
        # The usual case, kept cheap (every job of a burst comes through here): one slot,
        # on time, no jitter.
        return Plan(take=due, missed=[], caught_up=[], ready=list(due))
    ready = [s for s in due if s + jitter_us(spec.name, s, spec.jitter_us) <= now_us]
    # One rule for every policy: only the newest slot due can be on time (a slot a newer
    # one has come after is late, however recent), and only within the tolerance.
    on_time = [s for s in ready[-1:] if now_us - s <= LATE_TOLERANCE_US + spec.jitter_us]
    late = ready[: len(ready) - len(on_time)]
    take = list(on_time)
    caught_up: list[int] = []
    if late:
        window = [s for s in late if now_us - s <= spec.catchup_window_us]
        if spec.catchup == "all":
            take = window[-spec.max_catchup :] + on_time
            # The whole backlog runs one after another, its on-time slot last: none of
            # it is "skipped while the previous one runs".
            caught_up = list(take) if window else []
        elif spec.catchup == "latest" and not on_time and window:
            take = [window[-1]]
            caught_up = list(take)
    taken = set(take)
    missed = [s for s in ready if s not in taken]
    return Plan(take=take, missed=missed, caught_up=caught_up, ready=ready)


def claim_for(
    spec: JobSpec,
    slot: int,
    trigger: str,
    *,
    deadline_us: int | None = None,
    fingerprint: str | None = None,
) -> SlotClaim:
    """The claim of one slot of ``spec`` (``fingerprint``: of the definition it is made
    for, see :class:`~fleetcron.models.SlotClaim`)."""
    return SlotClaim(
        job=spec.name,
        slot_us=slot,
        run_id=str(uuid.uuid4()),
        exclusive=spec.overlap != "allow",
        max_attempts=spec.retries + 1,
        trigger=trigger,
        least_us=spec.lock_at_least_us,
        deadline_us=deadline_us,
        fingerprint=fingerprint,
    )


def deadline(spec: JobSpec, slot: int) -> int:
    """The store time by which a slot's first attempt must start, else it is recorded as
    ``missed`` at claim time: a replica that fell behind sheds stale slots under the
    job's catch-up policy instead of running them late. ``skip``: while the slot is on
    time (within :data:`LATE_TOLERANCE_US` and before the next slot fires); ``all``:
    within the catch-up window; ``latest``: until the next slot fires (a newer slot
    supersedes it), within the window."""
    on_time = slot + LATE_TOLERANCE_US + spec.jitter_us
    if spec.catchup == "all":
        return max(on_time, slot + spec.catchup_window_us)
    following = spec.schedule.next_after(slot)
    fires = (
        None if following is None else following + jitter_us(spec.name, following, spec.jitter_us)
    )
    if spec.catchup == "skip":
        # On time: within the tolerance, and before the next slot comes (the same rule
        # as planning's).
        return on_time if fires is None else min(on_time, fires)
    # latest: an on-time slot runs whatever the window (a window shorter than the
    # tolerance must not shed it), until the next slot supersedes it.
    window = max(slot + spec.catchup_window_us, on_time)
    return window if fires is None else min(window, fires)
