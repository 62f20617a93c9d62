"""Frozen value objects shared by the stores and the public API."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = [
    "ADVISORY_TOKEN",
    "CLAIM_STATUSES",
    "FINAL_STATES",
    "LEADER_LEASE",
    "MEMBERS_LEASE",
    "PAUSABLE_TRIGGERS",
    "PROGRESS_TRIGGERS",
    "REPLICA_RETAIN_US",
    "RUN_STATES",
    "TRIGGERS",
    "AdvisoryHold",
    "ClaimResult",
    "DefinitionConflict",
    "JobRecord",
    "LeaseRecord",
    "ReplicaInfo",
    "ReplicaRecord",
    "RunFinish",
    "RunNote",
    "RunOutcome",
    "RunRecord",
    "SlotClaim",
    "display_holder",
    "is_advisory_holder",
    "job_lease_name",
    "micros_to_datetime",
]

LEADER_LEASE = "fleetcron:leader"
"""The lease the elected leader of a namespace holds (``fleetcron run --mode leader``)."""
MEMBERS_LEASE = "fleetcron:members"
"""A lease no one holds for long: each claim-mode replica takes it for an instant when it
joins and when it leaves the replica table, so its fence is a version of the membership
the other replicas check instead of reading the whole table."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros_to_datetime(micros: int) -> datetime:
    """Convert microseconds since the Unix epoch to an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """A lease row as the store holds it. All times are the store's clock, in µs since epoch.

    ``now_us`` is the store's clock when the record was read, so callers can compute
    "held for" and "expires in" without consulting their own clock.
    """

    namespace: str
    name: str
    holder: str
    fence: int
    acquired_us: int
    expires_us: int
    min_until_us: int
    now_us: int

    @property
    def held(self) -> bool:
        """Whether the lease is valid at ``now_us`` (a lease is free at its expiry)."""
        return self.expires_us > self.now_us

    @property
    def acquired_at(self) -> datetime:
        return micros_to_datetime(self.acquired_us)

    @property
    def expires_at(self) -> datetime:
        return micros_to_datetime(self.expires_us)

    @property
    def holder_display(self) -> str:
        """``host:pid`` without the secret per-acquisition token."""
        return display_holder(self.holder)

    @property
    def mode(self) -> str:
        """The lock mode of the holder that wrote the row: ``advisory`` or ``lease``."""
        return "advisory" if is_advisory_holder(self.holder) else "lease"


ADVISORY_TOKEN = "advisory."
"""How the token of a holder in lock mode ``advisory`` starts (``host:pid:advisory.<hex>``;
the SQL that takes such a row over matches the same)."""


def is_advisory_holder(holder: str) -> bool:
    """Whether a lease row's ``holder`` was written by a holder in lock mode ``advisory``."""
    return holder.rpartition(":")[2].startswith(ADVISORY_TOKEN)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvisoryHold:
    """A session advisory lock held now on a lock name's key (lock mode ``advisory``,
    PostgreSQL), and its session: the server process (``pid``), the client's address
    (``None`` over a Unix socket, or when the reader may not see it), its
    ``application_name``, when the session started and when it took the lock
    (``held_since_us``: its last change of state). Times are the store's clock, µs since
    the epoch; ``now_us`` when read."""

    name: str
    key: int
    pid: int
    client_addr: str | None
    application_name: str | None
    backend_start_us: int | None
    held_since_us: int | None
    now_us: int

    @property
    def held_for_us(self) -> int | None:
        """How long the lock has been held, as far as the server tells."""
        return None if self.held_since_us is None else self.now_us - self.held_since_us


RUN_STATES = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "skipped",
    "missed",
    "cancelled",
    "lost",
)
FINAL_STATES = frozenset(RUN_STATES) - {"queued", "running"}
TRIGGERS = ("schedule", "manual", "backfill", "exec")
PROGRESS_TRIGGERS = frozenset({"schedule", "exec"})  # claims that move a job's high-water mark
PAUSABLE_TRIGGERS = frozenset({"schedule"})  # claims a paused job refuses


_TOKEN = re.compile(r"[0-9a-f]{20}")  # fleetcron.lease.new_holder's


def display_holder(holder: str) -> str:
    """A holder as it may be shown: ``host:pid``, without the secret per-acquisition
    token after them (nor what follows the token: the leader lease's holder is
    ``host:pid:token:leader``). A host may hold colons (an IPv6 address): the pid is the
    last all-digit part before the token."""
    parts = holder.split(":")
    for index in range(1, len(parts) - 1):
        if parts[index].isdigit() and _TOKEN.fullmatch(parts[index + 1]):
            return ":".join(parts[: index + 1])
    host, _, rest = holder.rpartition(":")
    return host if host else rest


def job_lease_name(job: str) -> str:
    """The lease row that serialises a job's runs and counts its fences."""
    return f"fleetcron:job:{job}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotClaim:
    """One slot a replica asks to run.

    ``exclusive``: the job's lease must be free and is taken (overlap ``skip``,
    ``buffer_one``, ``cancel_other``); otherwise only the job's fence counter moves
    (``allow``). ``max_attempts`` is ``1 + retries``. ``deadline_us``: the store time by
    which a first attempt must start; past it, a slot with no row is recorded as
    ``missed`` instead of claimed (``None``: no deadline). ``fingerprint``: the claiming
    replica's fingerprint of the job's definition; while the job's registered definition
    has another, the claim is refused (``conflict``) and nothing is written (``None``: no
    check, as for ``fleetcron exec``).
    """

    job: str
    slot_us: int
    run_id: str
    exclusive: bool = True
    max_attempts: int = 1
    trigger: str = "schedule"
    least_us: int = 0
    deadline_us: int | None = None
    fingerprint: str | None = None

    def conflicts_with(self, stored_fingerprint: str | None) -> bool:
        """Whether the job's registered definition (``stored_fingerprint``; ``None`` or
        ``''``: none registered) is another than the one this claim was made for."""
        mine = self.fingerprint
        return mine is not None and stored_fingerprint not in (None, "", mine)

    @property
    def moves_progress(self) -> bool:
        """Whether claiming (or missing) the slot moves the job's high-water mark: schedule
        progress, not a manual run or a backfill."""
        return self.trigger in PROGRESS_TRIGGERS

    @property
    def pausable(self) -> bool:
        """Whether a paused job refuses the claim (its schedule does; a trigger does not)."""
        return self.trigger in PAUSABLE_TRIGGERS


CLAIM_STATUSES = ("claimed", "not_due", "conflict", "paused", "taken", "missed", "busy")
"""What a slot claim answers: ``claimed``; ``not_due`` (the store's clock has not reached
the slot); ``conflict`` (the job's registered definition is another than the claimer's,
:meth:`SlotClaim.conflicts_with`: nothing is written); ``paused`` (a paused job's
schedule); ``taken`` (the slot has a row that cannot be claimed: running elsewhere, or
final); ``missed`` (the slot had no row and its deadline had passed: it is now recorded as
``missed``); ``busy`` (the slot could run but the job's lease is held by another
attempt)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimResult:
    """The answer to one :class:`SlotClaim`: ``run`` is the claimed attempt when
    ``status`` is ``claimed``, else ``None``; ``status`` is one of :data:`CLAIM_STATUSES`;
    ``stored_fingerprint`` is the registered definition's fingerprint when it is
    ``conflict``, else ``None``."""

    job: str
    slot_us: int
    status: str
    run: RunRecord | None = None
    stored_fingerprint: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How an attempt ended. ``retry_after_us``: a failed attempt may be claimed again
    that long after the store's now (``None``: no retry)."""

    state: str
    exit_code: int | None = None
    error: str | None = None
    output: str | None = None
    retry_after_us: int | None = None


@dataclass(frozen=True, slots=True)
class RunFinish:
    """The outcome of one attempt to record, by its slot and the fence its claim gave it
    (one item of :meth:`~fleetcron.stores.base.Operations.run_finish_many`)."""

    job: str
    slot_us: int
    fence: int
    outcome: RunOutcome


@dataclass(frozen=True, slots=True)
class RunNote:
    """A final row (``skipped``, ``missed``) to write for a slot that has none (one item
    of :meth:`~fleetcron.stores.base.Operations.run_record_many`)."""

    job: str
    slot_us: int
    state: str
    error: str | None
    trigger: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """The ledger row of one slot ``(job, slot)``. Times are the store's clock in µs."""

    namespace: str
    job: str
    slot_us: int
    state: str
    attempt: int
    fence: int
    holder: str
    run_id: str
    trigger: str
    started_us: int | None
    finished_us: int | None
    expires_us: int | None
    retry_at_us: int | None
    cancel_requested: bool
    exit_code: int | None
    error: str | None
    output: str | None
    now_us: int

    @property
    def slot(self) -> datetime:
        return micros_to_datetime(self.slot_us)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    """A job as the store knows it: definition, pause flag, progress."""

    namespace: str
    job: str
    paused: bool
    definition: str
    fingerprint: str
    high_water_us: int | None
    last_success_us: int | None
    last_failure_us: int | None
    updated_us: int
    now_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DefinitionConflict:
    """Two replicas define ``job`` differently: ``local_fingerprint`` is this replica's
    definition, ``other_fingerprint`` the other one — the definition in the store (which
    governs) when this replica is the one that does not run the job, or the definition
    this replica replaced when it registered its own. ``since_us``: when this replica
    found out, on the store's clock (µs since the epoch)."""

    job: str
    local_fingerprint: str
    other_fingerprint: str
    since_us: int

    @property
    def since(self) -> datetime:
        return micros_to_datetime(self.since_us)


REPLICA_RETAIN_US = 600_000_000
"""How long a replica that stopped beating is still listed, as gone, after its row expired
(10 minutes); a later beat of any replica of the namespace deletes the row after that."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaInfo:
    """What a running replica says of itself in each heartbeat.

    ``replica_id`` is ``host:pid:<random>``, stable for the life of the process and never a
    lease's secret token; ``mode`` is ``claim`` or ``leader``; ``jobs_fingerprint`` is a
    stable hash of the ``(job, definition fingerprint)`` pairs the replica runs, equal on
    replicas that run the same definitions.
    """

    replica_id: str
    host: str
    pid: int
    version: str
    mode: str
    jobs_fingerprint: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaRecord:
    """A replica's heartbeat row as the store holds it. Times are the store's clock in µs:
    ``started_us`` is its first beat (kept by every later one), ``last_seen_us`` its latest
    beat, ``expires_us`` when the row stops counting as up unless it beats again, and
    ``now_us`` the store's clock when the row was read, so callers judge liveness in store
    time, never by their own clock."""

    namespace: str
    replica_id: str
    host: str
    pid: int
    version: str
    mode: str
    jobs_fingerprint: str
    started_us: int
    last_seen_us: int
    expires_us: int
    now_us: int

    @property
    def alive(self) -> bool:
        """Whether the replica is up at ``now_us``: its row has not expired."""
        return self.expires_us > self.now_us

    @property
    def gone(self) -> bool:
        """The replica stopped beating without leaving (it crashed, hung or lost the store):
        its row expired and is still listed for :data:`REPLICA_RETAIN_US`."""
        return not self.alive

    @property
    def silent_us(self) -> int:
        """How long since its last beat, on the store's clock ("stopped beating 3 min ago")."""
        return max(0, self.now_us - self.last_seen_us)

    @property
    def started_at(self) -> datetime:
        return micros_to_datetime(self.started_us)

    @property
    def last_seen_at(self) -> datetime:
        return micros_to_datetime(self.last_seen_us)

    @property
    def expires_at(self) -> datetime:
        return micros_to_datetime(self.expires_us)
