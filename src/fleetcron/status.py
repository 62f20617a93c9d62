"""What ``fleetcron status``, the metrics and the dashboard show: one view model, read
from the store in one operation (so the sync and the async face share it), and its JSON
shape (``status --json`` and the dashboard's ``/api/status``).

Reading every job costs one round trip for the job rows, one for the leases, one for the
replicas and one per 500 selected jobs for their recent ledger rows. A paged read
(:class:`Page`: the dashboard's job list) reads the ledger of the jobs it shows only: every
job's state comes from its row (:func:`~fleetcron.health.row_state`), except for the jobs
whose row cannot tell — a run in progress, found in one round trip through the index of
running rows, or no success yet — which are assessed from their ledger as the shown ones
are. So its cost follows the page and the jobs in trouble, not the size of the fleet; the
counts by state (:attr:`FleetStatus.totals`) cover every job either way.

The monitor's alert markers (lease rows named :data:`ALERT_MARKER_PREFIX`…, see
:mod:`fleetcron.scheduling.monitor`) are bookkeeping, not locks: they come with the lease
list at no extra cost but are kept apart (:attr:`FleetStatus.markers`), so no listing —
``status``, ``locks``, the dashboard — shows them (:func:`shown_leases`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetcron.health import UNHEALTHY, JobHealth, JobState, assess, row_state
from fleetcron.health_cache import HealthCache
from fleetcron.models import (
    FINAL_STATES,
    LEADER_LEASE,
    REPLICA_RETAIN_US,
    JobRecord,
    LeaseRecord,
    ReplicaRecord,
    RunRecord,
    display_holder,
)
from fleetcron.queue_models import QueueStats
from fleetcron.schedules import iso_utc
from fleetcron.stores.base import AsyncStore, Operation, Operations

__all__ = [
    "ALERT_MARKER_PREFIX",
    "FINGERPRINT_SHOWN",
    "HISTORY",
    "ORDER",
    "FleetStatus",
    "Page",
    "is_alert_marker",
    "iso",
    "job_json",
    "lease_json",
    "page_json",
    "queue_json",
    "read_status",
    "read_status_in_turns",
    "replica_json",
    "run_duration_us",
    "run_json",
    "shown_leases",
    "status_json",
]

HISTORY = 50  # ledger rows read per job: the last run, durations, starvation
_LIST_BATCH = 500  # jobs whose ledger rows are read per round trip
FINGERPRINT_SHOWN = 12  # hex digits of a jobs fingerprint shown to people
ALERT_MARKER_PREFIX = "fleetcron:alert:"
"""The names of the monitor's alert markers begin with this (``fleetcron:alert:<job>``)."""


def is_alert_marker(name: str) -> bool:
    """Whether the lease row ``name`` is one of the monitor's alert markers, which record
    the alerts said instead of locking anything, and which no listing shows."""
    return name.startswith(ALERT_MARKER_PREFIX)


def shown_leases(leases: Iterable[LeaseRecord]) -> list[LeaseRecord]:
    """``leases`` without the alert markers: the lease rows a listing shows."""
    return [lease for lease in leases if not is_alert_marker(lease.name)]


ORDER: tuple[JobState, ...] = ("overdue", "stuck", "failing", "unknown", "running", "ok", "paused")
"""The states worst first: the order of a status read's jobs (then by name), and of its
counts."""
_RANK: dict[str, int] = {state: rank for rank, state in enumerate(ORDER)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """The part of the selected jobs a status read returns in full: worst first (then by
    name), those in ``states`` (every state when ``None``), from the ``offset``-th (0 is
    the first) on, at most ``limit`` of them (all when ``None``)."""

    states: frozenset[JobState] | None = None
    offset: int = 0
    limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetStatus:
    """A namespace at one instant of the store's clock."""

    namespace: str
    now_us: int
    jobs: tuple[JobHealth, ...]  # every selected job, worst first; a page of them if paged
    leader: LeaseRecord | None  # the leader lease while held (leader mode)
    unknown_jobs: tuple[str, ...]  # asked for, but the store has no row of them
    leases: tuple[LeaseRecord, ...] = ()  # the lease rows but markers, by name (not paged)
    markers: tuple[LeaseRecord, ...] = ()  # the monitor's alert markers, by name (not paged)
    replicas: tuple[ReplicaRecord, ...] = ()  # up, and gone within the retention, by id
    queues: tuple[QueueStats, ...] = ()  # the namespace's work queues, by name
    totals: Mapping[str, int] = field(default_factory=dict)  # every selected job, by state
    matched: int = 0  # the selected jobs in the page's states (all selected: not paged)
    page: Page | None = None  # what was asked for; None: every selected job is in `jobs`

    @property
    def unhealthy(self) -> tuple[JobHealth, ...]:
        """The jobs of :attr:`jobs` that ``status --check`` fails on: overdue, failing or
        stuck."""
        return tuple(health for health in self.jobs if not health.healthy)

    @property
    def healthy(self) -> bool:
        """No selected job is overdue, failing or stuck — on the page or off it."""
        return not any(self.totals.get(state) for state in UNHEALTHY)

    @property
    def total(self) -> int:
        """How many jobs were selected (all of the namespace's, unless named)."""
        return sum(self.totals.values())

    @property
    def differing_replicas(self) -> frozenset[str]:
        """The ids of the live replicas whose jobs fingerprint is not the one most live
        replicas share (every live one when no fingerprint is shared by most): a replica
        left on another jobs file. Gone replicas run nothing and are not compared."""
        live = [replica for replica in self.replicas if replica.alive]
        counts = Counter(replica.jobs_fingerprint for replica in live)
        if len(counts) < 2:
            return frozenset()
        (common, most), (_, second) = counts.most_common(2)
        shared = common if most > second else None
        return frozenset(r.replica_id for r in live if r.jobs_fingerprint != shared)

    @property
    def notes(self) -> tuple[str, ...]:
        """What a reader should know beside the jobs: replicas that run other job
        definitions than the rest (the store's definition governs; the others run none of
        those jobs' slots)."""
        differing = self.differing_replicas
        live = [replica for replica in self.replicas if replica.alive]
        return tuple(
            f"replica {replica.replica_id} runs other job definitions than "
            f"{sum(r.jobs_fingerprint != replica.jobs_fingerprint for r in live)} other live "
            f"replica(s) (jobs fingerprint {replica.jobs_fingerprint[:FINGERPRINT_SHOWN]})"
            for replica in live
            if replica.replica_id in differing
        )


def read_status(
    ops: Operations,
    namespace: str,
    jobs: Sequence[str] | None = None,
    *,
    history: int = HISTORY,
    queues: bool = True,
    page: Page | None = None,
) -> Operation[FleetStatus]:
    """Read the health of ``jobs`` (all when ``None``), worst first, with the namespace's
    replicas (up, and gone within :data:`REPLICA_RETAIN_US`) and, unless ``queues`` is
    false (a reader that shows no queue spares the store their count), its queues.

    Without ``page``, every selected job is assessed and returned, and the namespace's
    leases come along, its alert markers apart. With ``page``, only the jobs of the page
    are returned (and their ledger read); the others are counted by state in
    :attr:`FleetStatus.totals`, and of the leases only the leader's is read."""
    if page is not None:
        return (yield from _read_page(ops, namespace, jobs, history, queues, page))
    fleet = yield from _read_fleet(ops, namespace, jobs, queues)
    healths: list[JobHealth] = []
    for chunk in _chunks(fleet.selected()):
        ledgers = yield from ops.run_list_many(
            namespace, [row.job for row in chunk], history, output=False
        )
        healths += fleet.assessed(chunk, ledgers)
    return fleet.status(healths)


async def read_status_in_turns(
    store: AsyncStore,
    namespace: str,
    jobs: Sequence[str] | None = None,
    *,
    history: int = HISTORY,
    queues: bool = True,
    cache: HealthCache | None = None,
) -> FleetStatus:
    """:func:`read_status` as several operations: the fleet's rows in one, then the ledger
    rows of each :data:`_LIST_BATCH` jobs in one more, so that a long read never holds
    the store for long (a replica's monitor shares the store with its scheduling).

    With a ``cache`` (the monitor's), only the jobs whose rows changed since the read
    before, or whose health may have changed with time, have their ledger read and are
    assessed; the others keep the health the cache holds."""
    fleet = await store.run(_read_fleet(store.ops, namespace, jobs, queues))
    rows = fleet.selected()
    healths: list[JobHealth] = []
    if cache is not None:
        healths, rows = cache.split(rows, fleet.leases, fleet.now_us)
    for chunk in _chunks(rows):
        names = [row.job for row in chunk]
        ledgers = await store.run(store.ops.run_list_many(namespace, names, history, output=False))
        assessed = fleet.assessed(chunk, ledgers)
        if cache is not None:
            cache.keep(chunk, ledgers, assessed)
        healths += assessed
    return fleet.status(healths)


def _rank(state: str) -> int:
    return _RANK.get(state, len(ORDER))


def _chunks(rows: list[JobRecord]) -> Iterable[list[JobRecord]]:
    """``rows``, :data:`_LIST_BATCH` at a time: the jobs whose ledger one round trip reads."""
    for start in range(0, len(rows), _LIST_BATCH):
        yield rows[start : start + _LIST_BATCH]


@dataclass(frozen=True)
class _Fleet:
    """What a status read finds before the ledger: the selected job rows and the rest."""

    namespace: str
    wanted: frozenset[str] | None
    rows: list[JobRecord]
    leases: list[LeaseRecord]
    replicas: list[ReplicaRecord]
    queues: list[QueueStats]
    now_us: int

    def selected(self) -> list[JobRecord]:
        """The rows of the selected jobs, by name."""
        return [r for r in self.rows if self.wanted is None or r.job in self.wanted]

    def assessed(
        self, rows: Sequence[JobRecord], ledgers: Sequence[Sequence[RunRecord]]
    ) -> list[JobHealth]:
        """The health of each job of ``rows`` from its ledger rows, every job at the one
        instant of the read (so jobs of one schedule share their cron arithmetic)."""
        return [
            assess(row, runs, now_us=self.now_us) for row, runs in zip(rows, ledgers, strict=True)
        ]

    def status(
        self,
        healths: list[JobHealth],
        *,
        totals: Mapping[str, int] | None = None,
        matched: int | None = None,
        page: Page | None = None,
    ) -> FleetStatus:
        """The view model: ``healths`` worst first; ``totals`` and ``matched`` default to
        what ``healths`` hold (an unpaged read)."""
        healths.sort(key=lambda h: (_rank(h.state), h.job))
        if totals is None:
            totals = Counter(health.state for health in healths)
        leases = self.leases
        leader = next((le for le in leases if le.name == LEADER_LEASE and le.held), None)
        found = {row.job for row in self.rows}
        return FleetStatus(
            namespace=self.namespace,
            now_us=self.now_us,
            jobs=tuple(healths),
            leader=leader,
            unknown_jobs=tuple(sorted((self.wanted or set()) - found)),
            leases=tuple(shown_leases(leases)) if page is None else (),
            markers=tuple(le for le in leases if is_alert_marker(le.name)) if page is None else (),
            replicas=tuple(self.replicas),
            queues=tuple(self.queues),
            totals={state: totals.get(state, 0) for state in ORDER},
            matched=len(healths) if matched is None else matched,
            page=page,
        )


def _read_fleet(
    ops: Operations,
    namespace: str,
    jobs: Sequence[str] | None,
    queues: bool,
    *,
    leases: bool = True,
) -> Operation[_Fleet]:
    """The job rows, the replicas, the queues' counts and the lease rows — or, without
    ``leases``, only the leader's (the namespace holds a lease row per job, and an alert
    marker per job alerted on: twice as many rows as jobs)."""
    rows = yield from ops.job_list(namespace)
    if leases:
        lease_rows = yield from ops.lease_list(namespace)
    else:
        leader = yield from ops.lease_get(namespace, LEADER_LEASE)
        lease_rows = [leader] if leader is not None else []
    replicas = yield from ops.replica_list(namespace, REPLICA_RETAIN_US)
    queue_stats = (yield from ops.queue_stats(namespace, None)) if queues else []
    if isinstance(jobs, str):
        jobs = [jobs]  # one job's name, not the characters of it
    clocks = [row.now_us for row in rows] + [lease.now_us for lease in lease_rows]
    now = max(clocks + [replica.now_us for replica in replicas], default=0)
    if not now:
        now = yield from ops.store_now()
    return _Fleet(
        namespace=namespace,
        wanted=frozenset(jobs) if jobs is not None else None,
        rows=rows,
        leases=lease_rows,
        replicas=replicas,
        queues=queue_stats,
        now_us=now,
    )


def _read_page(
    ops: Operations,
    namespace: str,
    jobs: Sequence[str] | None,
    history: int,
    queues: bool,
    page: Page,
) -> Operation[FleetStatus]:
    """:func:`read_status` of one page: every selected job's state, the page's health."""
    fleet = yield from _read_fleet(ops, namespace, jobs, queues, leases=False)
    rows = fleet.selected()
    now = fleet.now_us
    # A run in progress decides between running, stuck and the rest, and whether it is
    # stuck depends on the job's recent durations: such jobs are assessed in full. The
    # runs in progress come from the index of running rows, not from every job's ledger.
    running = (
        (yield from ops.run_running(namespace, [row.job for row in rows], history)) if rows else []
    )
    held = {run.job for run in running if (run.expires_us or 0) > now}
    states: dict[str, str] = {}
    unsure: list[JobRecord] = []
    for row in rows:
        state = row_state(row, now_us=now) if row.job not in held else None
        if state is None:
            unsure.append(row)
        else:
            states[row.job] = state
    full: dict[str, JobHealth] = {}
    for chunk in _chunks(unsure):
        ledgers = yield from ops.run_list_many(
            namespace, [row.job for row in chunk], history, output=False
        )
        full.update((h.job, h) for h in fleet.assessed(chunk, ledgers))
    states.update((job, health.state) for job, health in full.items())

    ordered = sorted(rows, key=lambda row: (_rank(states[row.job]), row.job))
    wanted = page.states
    matched = [row for row in ordered if wanted is None or states[row.job] in wanted]
    end = None if page.limit is None else page.offset + page.limit
    shown = matched[page.offset : end]
    for chunk in _chunks([row for row in shown if row.job not in full]):
        ledgers = yield from ops.run_list_many(
            namespace, [row.job for row in chunk], history, output=False
        )
        full.update((h.job, h) for h in fleet.assessed(chunk, ledgers))
    states.update((row.job, full[row.job].state) for row in shown)
    return fleet.status(
        [full[row.job] for row in shown],
        totals=Counter(states.values()),
        matched=len(matched),
        page=page,
    )


# -- the JSON shape: ISO 8601 times, durations in seconds, holders without their token ----
def iso(moment_us: int | None) -> str | None:
    """:func:`~fleetcron.schedules.iso_utc`, passing ``None`` through."""
    return None if moment_us is None else iso_utc(moment_us)


def _seconds(micros: int | None) -> float | None:
    return None if micros is None else micros / 1e6


def _run(run: RunRecord | None) -> dict[str, object] | None:
    if run is None:
        return None
    return {
        "slot": iso(run.slot_us),
        "state": run.state,
        "attempt": run.attempt,
        "fence": run.fence,
        "holder": display_holder(run.holder),
        "started": iso(run.started_us),
        "finished": iso(run.finished_us),
        "exit_code": run.exit_code,
        "error": run.error,
    }


def job_json(health: JobHealth) -> dict[str, object]:
    """One job of ``status --json`` (and of the dashboard's API)."""
    running = health.running
    return {
        "job": health.job,
        "state": health.state,
        "healthy": health.healthy,
        "reasons": list(health.reasons),
        "schedule": health.schedule,
        "timezone": health.timezone,
        "paused": health.paused,
        "next_slot": iso(health.next_slot_us),
        "expected_slot": iso(health.expected_slot_us),
        "grace_s": _seconds(health.grace_us),
        "overdue": health.overdue,
        "failing": health.failing,
        "stuck": health.stuck,
        "starved": health.starved,
        "last_run": _run(health.last_run),
        "last_success": iso(health.last_success_us),
        "last_failure": iso(health.last_failure_us),
        "running": _run(running),
        "holder": display_holder(running.holder) if running is not None else None,
        "lease_age_s": _seconds(health.lease_age_us),
        "lock_at_most_s": _seconds(health.lock_at_most_us),
        "stuck_after_s": _seconds(health.stuck_after_us),
        "p95_duration_s": _seconds(health.p95_duration_us),
    }


def replica_json(replica: ReplicaRecord, *, differs: bool = False) -> dict[str, object]:
    """One replica of ``status --json``: ``alive`` while its heartbeat row has not
    expired; ``differs`` when it runs other job definitions than most live replicas."""
    return {
        "replica_id": replica.replica_id,
        "host": replica.host,
        "pid": replica.pid,
        "version": replica.version,
        "mode": replica.mode,
        "jobs_fingerprint": replica.jobs_fingerprint,
        "alive": replica.alive,
        "started": iso(replica.started_us),
        "last_seen": iso(replica.last_seen_us),
        "expires": iso(replica.expires_us),
        "silent_s": _seconds(replica.silent_us),
        "differs": differs,
    }


def page_json(status: FleetStatus) -> dict[str, object] | None:
    """Which part of the jobs ``jobs`` holds: ``None`` when it holds every selected job."""
    page = status.page
    if page is None:
        return None
    return {
        "offset": page.offset,
        "limit": page.limit,
        "state": None if page.states is None else [s for s in ORDER if s in page.states],
        "matched": status.matched,
    }


def status_json(status: FleetStatus) -> dict[str, object]:
    """The whole of ``status --json`` (and the dashboard's ``/api/status``): ``healthy``
    and ``totals`` (jobs by state, worst first) cover every selected job, ``jobs`` the
    page of them that ``page`` describes (``null``: all of them)."""
    leader = status.leader
    differing = status.differing_replicas
    return {
        "namespace": status.namespace,
        "now": iso(status.now_us),
        "healthy": status.healthy,
        "leader": None
        if leader is None
        else {
            "holder": leader.holder_display,
            "fence": leader.fence,
            "since": iso(leader.acquired_us),
        },
        "totals": dict(status.totals),
        "total": status.total,
        "page": page_json(status),
        "jobs": [job_json(health) for health in status.jobs],
        "replicas": [
            replica_json(replica, differs=replica.replica_id in differing)
            for replica in status.replicas
        ],
        "queues": [queue_json(queue) for queue in status.queues],
        "notes": list(status.notes),
    }


def queue_json(queue: QueueStats) -> dict[str, object]:
    """One work queue's standing (counts by state, the oldest claimable item's wait)."""
    return {
        "queue": queue.queue,
        "ready": queue.ready,
        "scheduled": queue.scheduled,
        "claimed": queue.claimed,
        "done": queue.done,
        "dead": queue.dead,
        "oldest_waiting_s": _seconds(queue.oldest_age_us),
    }


def lease_json(lease: LeaseRecord) -> dict[str, object]:
    """One lease row: its holder without the secret token; ``held_for_s`` and
    ``expires_in_s`` on the store's clock while it is held."""
    held = lease.held
    return {
        "name": lease.name,
        "holder": lease.holder_display,
        "fence": lease.fence,
        "held": held,
        "acquired": iso(lease.acquired_us),
        "expires": iso(lease.expires_us),
        "held_for_s": _seconds(lease.now_us - lease.acquired_us) if held else None,
        "expires_in_s": _seconds(lease.expires_us - lease.now_us) if held else None,
    }


def run_duration_us(run: RunRecord) -> int | None:
    """How long the attempt ran (so far, while it runs), on the store's clock."""
    if run.started_us is None:
        return None
    end = run.finished_us if run.finished_us is not None else run.now_us
    return max(0, end - run.started_us)


def run_json(run: RunRecord) -> dict[str, object]:
    """One ledger row, as ``fleetcron runs --json`` lists it, and when it ``finished``."""
    duration = run_duration_us(run)
    final = run.state in FINAL_STATES
    return {
        "job": run.job,
        "slot": iso(run.slot_us),
        "state": run.state,
        "attempt": run.attempt,
        "fence": run.fence,
        "holder": display_holder(run.holder) or None,
        "trigger": run.trigger,
        "started": iso(run.started_us),
        "finished": iso(run.finished_us) if final else None,
        "duration_s": None if duration is None else round(duration / 1e6, 3),
        "exit_code": run.exit_code,
        "error": run.error,
    }
