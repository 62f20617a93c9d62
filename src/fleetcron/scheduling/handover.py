"""Hand-over: the slots another replica owns, looked at once their owner had its chance.

In claim mode the live replicas running the same job definitions share out the slots
(:class:`~fleetcron.scheduling.ownership.Ring`). A replica claims its own slots as soon as
they are due; another replica's slot waits here for its hand-over delay — a quarter of the
time its catch-up policy gives it, at most :data:`~fleetcron.scheduling.ownership.HANDOVER_US`
— and is then *adopted* if one read (``run_settled``, many slots at once) says it is still
free: the slots of a replica that is down, frozen or behind still run, a little later.

While the owners keep up (nothing left to adopt) the reads space out to once a second, but
never so far that a waiting slot's deadline passes unlooked at. The ring's members are read
every heartbeat interval, and sooner (at most once a second) when it is stale: a claim of a
slot this replica thought its own was answered ``taken``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetcron.clock import Clock
from fleetcron.jobspec import JobSpec
from fleetcron.models import MEMBERS_LEASE, SlotClaim
from fleetcron.scheduling.ownership import BACKUPS, HANDOVER_US, Ring
from fleetcron.scheduling.planning import PlannedJob, claim_for, deadline
from fleetcron.stores.base import AsyncStore

__all__ = ["ADOPT_BATCH", "PARKED_LIMIT", "PARKED_US", "RING_FULL_EVERY_S", "Handover"]

ADOPT_BATCH = 2000
"""Other replicas' slots looked at per read."""
RING_FULL_EVERY_S = 60.0
"""How often the whole replica table is read even when the members' version did not move
(a replica that died without leaving moves nothing)."""
PARKED_US = 60_000_000
"""How long a slot this replica neither owns nor backs up is kept, within its deadline,
to be looked at should the members change (its owner and backups may have left)."""
PARKED_LIMIT = 100_000
"""At most this many such slots are kept (the oldest go first)."""
_ADOPT_EVERY_US = (250_000, 1_000_000)  # how often others' waiting slots are looked at
_RING_RESYNC_US = 1_000_000  # the ring is read again at most this often when it is stale


@dataclass(frozen=True, slots=True)
class _SlotFacts:
    """What a pass needs of one slot of a job, worked out under one definition of the job
    (``spec``) and one version of the ring."""

    spec: JobSpec
    slot_us: int
    ring_version: int
    shared: bool
    deadline_us: int


class Handover:
    """The slots of other replicas waiting for a look, and the ring that says whose they
    are. ``claiming`` says whether the replica shares slots at all (claim mode)."""

    def __init__(
        self,
        store: AsyncStore,
        namespace: str,
        ring: Ring,
        *,
        claiming: bool,
        ring_every_s: float,
        clock: Clock,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self.ring = ring
        self._claiming = claiming
        self._ring_every_us = ring_every_s * 1e6
        self._clock = clock
        # (look at, job, slot, deadline), the store's clock. No claim is made for them (a
        # run id each) unless one is adopted.
        self._waiting: deque[tuple[int, str, int, int | None]] = deque()
        # (deadline, job, slot): slots neither owned nor backed up here, kept until their
        # deadline (at most PARKED_US) in case the members change meanwhile.
        self._parked: deque[tuple[int, str, int]] = deque()
        self._every_us = _ADOPT_EVERY_US[0]
        self._at_us = 0
        self._cap_us = _ADOPT_EVERY_US[1]  # spacing cap: half the shortest window
        self._read_us: int | None = None  # monotonic µs of the last ring reading
        self._full_us: int | None = None  # ...and of the last reading of the whole table
        self._members_version: int | None = None  # the members lease's fence then
        self.stale = True
        """The members may have changed: read them again within a second."""

    # -- whose slot ----------------------------------------------------------------------
    def shared(self, job: str, slot_us: int) -> bool:
        """Whether the slot is one another replica owns (claim mode only)."""
        return self._claiming and not self.ring.owns(job, slot_us)

    def slot_facts(self, job: PlannedJob, slot_us: int) -> tuple[bool, int]:
        """Whether another replica owns the slot, and its deadline: worked out once per
        slot, when the job went in the due heap for it (:meth:`collect_delay_us`), unless
        the job's definition or the ring has changed since (kept in ``job.next``)."""
        spec, known, version = job.spec, job.next, self.ring.version
        if (
            isinstance(known, _SlotFacts)
            and known.spec is spec
            and known.slot_us == slot_us
            and known.ring_version == version
        ):
            return known.shared, known.deadline_us
        shared = self.shared(spec.name, slot_us)
        slot_deadline = deadline(spec, slot_us)
        job.next = _SlotFacts(spec, slot_us, version, shared, slot_deadline)
        return shared, slot_deadline

    def collect_delay_us(self, job: PlannedJob, slot_us: int) -> int:
        """How long after its fire time a slot is collected: at once when this replica
        owns it (or runs alone, or leads), else after its hand-over wait
        (:meth:`delay_us`, twice that for the second backup and the other members)."""
        shared, slot_deadline = self.slot_facts(job, slot_us)
        if not shared:
            return 0
        rank = min(self.ring.rank(job.spec.name, slot_us), 2)
        return rank * self.delay_us(slot_deadline, slot_us)

    @staticmethod
    def delay_us(deadline_us: int | None, slot_us: int) -> int:
        """How long after it is due another replica's slot waits for its owner: a quarter
        of the time the slot's catch-up policy gives it, at most
        :data:`~fleetcron.scheduling.ownership.HANDOVER_US` (at least 1 µs: another's slot
        always waits)."""
        if deadline_us is None:
            return HANDOVER_US
        return max(1, min(HANDOVER_US, (deadline_us - slot_us) // 4))

    def replace_ring(self, ring: Ring) -> None:
        """Take a new ring (the job definitions changed: the peers are the replicas that
        run the new set); its members are read at the next pass."""
        self.ring = ring
        self.stale = True

    async def read_ring(self) -> bool:
        """Read the ring's members every heartbeat interval, and at most once a second
        while it is :attr:`stale`; whether the members changed."""
        if not self._claiming:
            return False
        now = self._clock.monotonic_us()
        last = self._read_us
        if not (
            last is None
            or now - last >= self._ring_every_us
            or (self.stale and now - last >= _RING_RESYNC_US)
        ):
            return False
        self._read_us = now
        ops = self._store.ops
        full = (
            self.stale
            or self._full_us is None
            or now - self._full_us >= max(RING_FULL_EVERY_S * 1e6, self._ring_every_us)
        )
        try:
            # The members' version first: unchanged, the table is not read (joins and
            # leaves move it; deaths show at the next full read, the backups covering the
            # slots of the dead meanwhile).
            members = await self._store.run(ops.lease_get(self._namespace, MEMBERS_LEASE))
            version = None if members is None else members.fence
            if not full and version is not None and version == self._members_version:
                return False
            rows = await self._store.run(ops.replica_list(self._namespace, 0))
        except BaseException:
            self.stale = True  # tried again within a second, not a heartbeat later
            raise
        self.stale = False
        self._full_us = now
        self._members_version = version
        before = self.ring.version
        self.ring.update(rows)
        return self.ring.version != before

    def look_again(self, now: int) -> int:
        """The members changed: the parked slots still within their deadline are ranked
        again, and those this replica now owns or backs up are looked at at once — their
        owner and backups may be the replicas that left. Returns how many were queued (a
        read tells which are still free)."""
        queued = 0
        parked, self._parked = self._parked, deque()
        for slot_deadline, job, slot in parked:
            if slot_deadline <= now:
                continue
            if self.ring.rank(job, slot) > BACKUPS:
                self._parked.append((slot_deadline, job, slot))
                continue
            self._waiting.append((now, job, slot, slot_deadline))
            queued += 1
        if queued:
            self._at_us = min(self._at_us, now)
        return queued

    # -- the waiting slots ---------------------------------------------------------------
    def wait_for_owner(
        self, job: str, slot_us: int, deadline_us: int | None, now: int, *, ripe: bool = False
    ) -> bool:
        """Queue another replica's slot: looked at after :meth:`delay_us` (at once when
        ``ripe``, collected after that wait already); the reads are spaced so that it is
        looked at again before half of the time its policy gives it has passed. Returns
        whether it was queued (``False``: parked, this replica is not one of its backups)."""
        rank = self.ring.rank(job, slot_us)
        if rank > BACKUPS:
            # Neither owner nor backup: not looked at (a bounded number of reads per slot,
            # whatever the number of replicas) unless the members change before its
            # deadline (look_again).
            self._park(job, slot_us, deadline_us, now)
            return False
        window = None if deadline_us is None else deadline_us - slot_us
        wait = 0 if ripe else rank * self.delay_us(deadline_us, slot_us)
        if window is not None:
            self._cap_us = min(self._cap_us, max(window // 2, 1))
            # Reads spaced out while owners kept up must not pass this slot's deadline.
            self._at_us = min(self._at_us, now + wait + window // 2)
        self._waiting.append((now + wait, job, slot_us, deadline_us))
        return True

    def _park(self, job: str, slot_us: int, deadline_us: int | None, now: int) -> None:
        parked = self._parked
        while parked and (parked[0][0] <= now or len(parked) >= PARKED_LIMIT):
            parked.popleft()  # past its deadline (roughly in order), or the oldest
        if deadline_us is not None and deadline_us > now:
            parked.append((min(deadline_us, now + PARKED_US), job, slot_us))

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop the waiting slots of the jobs ``keep`` says no to (removed by a reload)."""
        self._waiting = deque(w for w in self._waiting if keep(w[1]))
        self._parked = deque(p for p in self._parked if keep(p[1]))

    def next_look_us(self) -> int | None:
        """When the next adoption read is due (store time), ``None``: nothing waits."""
        if not self._waiting:
            return None
        return max(self._waiting[0][0], self._at_us)

    async def adopt(
        self, now: int, jobs: Mapping[str, PlannedJob]
    ) -> tuple[list[SlotClaim], set[tuple[str, int]]]:
        """Look at the waiting slots whose delay has passed (up to :data:`ADOPT_BATCH`, one
        read): the claims of those still free, and the ``(job, slot)`` the store has
        settled (dropped). Call it only when the replica has room and none of its own
        slots waiting: in a burst every replica first drains its own share, then takes
        over what is left of the others'."""
        waiting = self._waiting
        if not waiting or waiting[0][0] > now or now < self._at_us:
            return [], set()
        ripe: list[tuple[int, str, int, int | None]] = []
        while waiting and waiting[0][0] <= now and len(ripe) < ADOPT_BATCH:
            ripe.append(waiting.popleft())
        asked = [(job, slot) for _, job, slot, _ in ripe]
        try:
            settled = await self._store.run(self._store.ops.run_settled(self._namespace, asked))
        except BaseException:
            waiting.extendleft(
                (now, job, slot, slot_deadline) for _, job, slot, slot_deadline in reversed(ripe)
            )
            raise
        free = [
            claim_for(jobs[job].spec, slot, "schedule", deadline_us=slot_deadline)
            for _, job, slot, slot_deadline in ripe
            if (job, slot) not in settled and job in jobs
        ]
        low, high = _ADOPT_EVERY_US
        spacing = low if free else 2 * self._every_us
        self._every_us = min(spacing, high, self._cap_us)
        self._at_us = now + self._every_us
        if not waiting:
            self._cap_us = high
        return free, settled
