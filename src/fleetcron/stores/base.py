"""The store contract: operations as data, driven by a sync or an async runner.

Every store operation (lease acquire, extend, release, …) is written once per backend as a
generator that *yields* statements and receives their results, then returns a value. A
:class:`SyncStore` or :class:`AsyncStore` drives it with a real connection. One
implementation gives native sync and async, and every operation can be unit-tested by
feeding it canned results (the sans-I/O style of h11).

Contract every backend keeps (``tests/contract`` is the executable specification):

- All lease time is the store's clock. A lease is valid while ``store_now < expires``; it is
  free *at* its expiry.
- ``lease_acquire`` returns the new record, or ``None`` when the lease is held. Its fence is
  ``max(previous fence + 1, store_now_us)``: strictly increasing per name across release,
  expiry, prune and (Redis) the loss of all data, as long as the store clock does not step
  backwards.
- ``lease_extend`` / ``lease_release`` act only for the exact (holder, fence) and only on a
  lease that has not expired; otherwise they change nothing and report it.
- ``lease_release`` keeps the lease until ``min_until`` (``lock_at_least``).
- Lease rows are never deleted except by ``lease_prune`` of names unused for a given age.
- A replica's heartbeat row counts as up while ``store_now < expires``, like a lease; it is
  deleted by ``replica_leave`` or, once expired for longer than the retention, by a later
  ``replica_beat`` of the namespace (docs/design/replicas.md).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from fleetcron.errors import FleetcronError, StoreError, StoreUnavailable
from fleetcron.models import (
    REPLICA_RETAIN_US,
    ClaimResult,
    JobRecord,
    LeaseRecord,
    ReplicaInfo,
    ReplicaRecord,
    RunFinish,
    RunNote,
    RunOutcome,
    RunRecord,
    SlotClaim,
)
from fleetcron.queue_models import (
    CheckpointRecord,
    QueueItem,
    QueueNack,
    QueuePut,
    QueueStats,
)
from fleetcron.stores.statements import Statement

__all__ = [
    "QUEUE_PRUNE_LIMIT",
    "REPLICA_PRUNE_LIMIT",
    "AsyncStore",
    "Capability",
    "CheckpointOperations",
    "Operation",
    "Operations",
    "QueueOperations",
    "Statement",
    "SyncStore",
    "acquired_record",
    "as_text",
    "connect_error",
    "drive",
    "drive_async",
    "opened",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Capability(enum.Flag):
    """What a backend can promise, checked at start."""

    NONE = 0
    CROSS_HOST = enum.auto()  # safe across machines (SQLite and memory: no)
    SERVER_CLOCK = enum.auto()  # lease time comes from a store server's clock
    PERSISTENT = enum.auto()  # survives a restart of the process


Operation = Generator[Statement, Any, T]

REPLICA_PRUNE_LIMIT = 100
"""At most this many long-expired replica rows are deleted by one ``replica_beat``."""


def drive(operation: Operation[T], execute: Callable[[Statement], Any]) -> T:
    """Run ``operation`` to completion, executing each statement with ``execute``."""
    try:
        statement = next(operation)
        while True:
            statement = operation.send(execute(statement))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        operation.close()


async def drive_async(operation: Operation[T], execute: Callable[[Statement], Awaitable[Any]]) -> T:
    """Async twin of :func:`drive`: ``execute`` is a coroutine function."""
    try:
        statement = next(operation)
        while True:
            statement = operation.send(await execute(statement))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        operation.close()


QUEUE_PRUNE_LIMIT = 1000
"""At most this many finished items are deleted by one ``queue_prune``."""


@runtime_checkable
class QueueOperations(Protocol):
    """The work queue's operations (docs/design/queue.md). Each is one atomic step of the
    store, whatever the number of items it names (one statement or function, one
    transaction, one Lua script on the queue's hash tag, one step under a lock) — except
    ``queue_stats`` and ``queue_prune`` of every queue of a namespace (``queue=None``),
    which are atomic per queue. Times are the store's clock; answers are in input order.

    An item is *held* while it is ``claimed`` and its ``available_us`` (the claim's
    expiry) is later than the store's now; ``queue_extend``, ``queue_ack`` and
    ``queue_nack`` act only on an item held under the given fence, and otherwise change
    nothing and say so.
    """

    def queue_put(
        self, namespace: str, queue: str, items: Sequence[QueuePut]
    ) -> Operation[list[int | None]]:
        """Add ``items`` as ``ready`` (``available_us = now + delay_us``, ``attempts`` 0,
        ``fence`` 0, ``created_us = now``); each one's new id — ids increase in input
        order and never repeat within the queue — or ``None`` for an item whose
        ``dedupe_key`` an item of the queue already has (in any state, until pruned),
        including one put earlier in the same call."""
        ...

    def queue_claim(
        self, namespace: str, queue: str, holder: str, limit: int, visibility_us: int
    ) -> Operation[list[QueueItem]]:
        """Deliver up to ``limit`` claimable items (``ready`` or ``claimed``, with
        ``available_us <= now``), oldest ``available_us`` first, then lowest id, skipping
        items a concurrent claim has locked (claimers never wait on each other and never
        get the same item). Each delivered item becomes ``claimed`` by ``holder``:
        ``attempts + 1``, ``fence = max(fence + 1, now)``, ``available_us = now +
        visibility_us``. An item whose claim expired with its deliveries used up
        (``attempts >= max_attempts``) becomes ``dead`` instead (``finished_us = now``,
        ``error`` "claim expired after N deliveries") and is not returned, so fewer than
        ``limit`` items do not mean the queue is empty. Returns the delivered rows."""
        ...

    def queue_extend(
        self,
        namespace: str,
        queue: str,
        claims: Sequence[tuple[int, int]],
        visibility_us: int,
    ) -> Operation[list[int | None]]:
        """For each ``(item_id, fence)`` held under that fence: ``available_us = now +
        visibility_us``, answered; ``None`` for one not held (expired, acknowledged,
        claimed again) — nothing changes for it."""
        ...

    def queue_ack(
        self, namespace: str, queue: str, claims: Sequence[tuple[int, int]]
    ) -> Operation[list[bool]]:
        """For each ``(item_id, fence)`` held under that fence: ``done``, ``finished_us =
        now``; ``False`` for one not held (a stale claim's ack is refused, changing
        nothing)."""
        ...

    def queue_nack(
        self, namespace: str, queue: str, nacks: Sequence[QueueNack]
    ) -> Operation[list[str | None]]:
        """Give back each held item with its ``error``: ``dead`` (``finished_us = now``)
        when its deliveries are used up (``attempts >= max_attempts``), else ``ready``
        again at ``now + retry_in_us``; answers the new state, or ``None`` for an item not
        held under that fence (nothing changes for it)."""
        ...

    def queue_get(self, namespace: str, queue: str, item_id: int) -> Operation[QueueItem | None]:
        """One item's row, or ``None``."""
        ...

    def queue_list(
        self, namespace: str, queue: str, states: Sequence[str] | None, limit: int
    ) -> Operation[list[QueueItem]]:
        """Up to ``limit`` items of the queue in ``states`` (``None``: any), newest id
        first."""
        ...

    def queue_stats(self, namespace: str, queue: str | None) -> Operation[list[QueueStats]]:
        """How each queue of the namespace stands (only ``queue``, when given), by name;
        a queue without items is not listed."""
        ...

    def queue_prune(
        self, namespace: str, queue: str | None, older_than_us: int, limit: int
    ) -> Operation[int]:
        """Delete up to ``limit`` ``done`` and ``dead`` items finished at least
        ``older_than_us`` before now (their dedupe keys become free), oldest finish first,
        then lowest id (of every queue of the namespace when ``queue`` is ``None``); how
        many."""
        ...

    def queue_requeue(self, namespace: str, queue: str, item_ids: Sequence[int]) -> Operation[int]:
        """Put ``dead`` items back: ``ready`` at now, ``attempts`` 0, ``finished_us`` and
        ``holder`` cleared (``error`` and ``fence`` kept); how many were dead."""
        ...


@runtime_checkable
class CheckpointOperations(Protocol):
    """High-water marks of jobs (``ctx.checkpoint``), fenced: a checkpoint moves only
    under a fence at least as high as the one that last moved it, so a stale run cannot
    move it back. Each operation is one atomic step and one round trip."""

    def checkpoint_get(self, namespace: str, name: str) -> Operation[CheckpointRecord | None]:
        """The checkpoint ``name``, or ``None`` when it was never set."""
        ...

    def checkpoint_set(self, namespace: str, name: str, fence: int, value: str) -> Operation[bool]:
        """Set ``value`` (``fence`` and ``updated_us = now`` with it) when the checkpoint
        is unset or its fence is at most ``fence``; ``False`` — nothing changed — when a
        higher fence has set it."""
        ...


@runtime_checkable
class Operations(QueueOperations, CheckpointOperations, Protocol):
    """Every operation of a store; each backend implements all of them. Each returns an
    :data:`Operation` to drive with the store's runner.

    Atomicity: every operation is one atomic step of the store — one statement or one
    function call (PostgreSQL), one transaction of a multi-statement text (MySQL), one
    ``BEGIN IMMEDIATE`` transaction (SQLite), one Lua script (Redis), one step under a lock
    (memory) — except where a docstring says otherwise: the claims of a ``run_claim`` batch
    (and the items of ``run_finish_many`` and ``job_register``) are each atomic, those of
    one job one after another in input order, those of different jobs in any order
    (PostgreSQL commits the items of distinct jobs together, one transaction per batch,
    taking their locks in job order so that batches never deadlock); operations over a
    whole namespace (``lease_list``, ``run_list``, ``run_due``, ``run_prune``, ``job_list``
    on Redis; ``run_settled``) read or change each row atomically, not the set as a whole.
    """

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        """Take the lease if free at the store's clock; ``None`` when held. On SQLite a
        lease whose holder has died on the store's one host is released on its behalf
        first, in the same transaction (:mod:`fleetcron.local_holder`)."""
        ...

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        """Set expiry to store_now + ttl for the current holder; ``None`` when not held."""
        ...

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        """Expire the lease now, or at ``min_until``; ``False`` when not ours (no change)."""
        ...

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        """The lease row of ``name`` (held or not), or ``None`` if it never existed."""
        ...

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        """Every lease row of ``namespace``, sorted by name."""
        ...

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        """Delete rows not held, and unused for ``older_than_us``; return their names."""
        ...

    # -- the run ledger (docs/design/ledger.md) -------------------------------------------
    def store_now(self) -> Operation[int]:
        """The store's clock, µs since the epoch."""
        ...

    def run_claim(
        self, namespace: str, claims: Sequence[SlotClaim], holder: str, ttl_us: int
    ) -> Operation[list[ClaimResult]]:
        """Claim slots in one round trip; returns one answer per claim, in input order:
        the claimed attempt, or why the slot was not claimed. A claim made for another
        definition of the job than the registered one is refused, writing nothing
        (:func:`conflict_answer`): a replica whose definition was superseded runs none
        of the job's slots."""
        ...

    def run_extend(
        self, namespace: str, job: str, slot_us: int, fence: int, ttl_us: int
    ) -> Operation[RunRecord | None]:
        """Renew a running attempt (and the job lease with the same fence)."""
        ...

    def run_finish(
        self, namespace: str, job: str, slot_us: int, fence: int, outcome: RunOutcome
    ) -> Operation[bool]:
        """Record an attempt's outcome; ``False`` (nothing changed) if no longer ours."""
        ...

    def run_finish_many(
        self, namespace: str, finishes: Sequence[RunFinish]
    ) -> Operation[list[bool]]:
        """:meth:`run_finish` for many attempts in one round trip: one answer per item, in
        input order. Each finish is atomic on its own, one after another (like the claims
        of a ``run_claim`` batch); a refused one changes nothing and does not stop the
        others."""
        ...

    def run_record(
        self, namespace: str, job: str, slot_us: int, state: str, error: str | None, trigger: str
    ) -> Operation[bool]:
        """Insert a final row (skipped, missed) for a slot that has none."""
        ...

    def run_record_many(self, namespace: str, notes: Sequence[RunNote]) -> Operation[list[bool]]:
        """:meth:`run_record` for many slots in one round trip: one answer per note, in
        input order, each insert atomic on its own (like the items of
        :meth:`run_finish_many`)."""
        ...

    def run_backfill(self, namespace: str, job: str, slots: Sequence[int]) -> Operation[int]:
        """Queue a run (trigger ``backfill``) of each of the job's ``slots`` that has no row
        and that the store's clock has reached, in one transaction: every such row is
        written, or none is (a failure or a lost connection midway leaves the ledger as it
        was). Never overwrites a row. Returns how many were queued. The caller bounds
        ``slots``: they are sent, and written, all at once (``fleetcron backfill`` sends
        at most 100,000)."""
        ...

    def run_cancel(
        self, namespace: str, job: str, slot_us: int | None = None, note: str | None = None
    ) -> Operation[int]:
        """Ask the job's unexpired running attempts (``slot_us``'s only, when given) to stop,
        with ``note`` as their ``error``; how many were asked (asked before included)."""
        ...

    def run_settled(
        self, namespace: str, slots: Sequence[tuple[str, int]]
    ) -> Operation[set[tuple[str, int]]]:
        """Which of these ``(job, slot_us)`` already have a row other than ``queued``: a
        first attempt of them can only be refused (a retry or a recovery still may be
        claimed). One read for many slots, locking nothing."""
        ...

    def run_get(self, namespace: str, job: str, slot_us: int) -> Operation[RunRecord | None]:
        """The ledger row of one slot."""
        ...

    def run_due(
        self, namespace: str, limit: int, jobs: Sequence[str] | None = None
    ) -> Operation[list[RunRecord]]:
        """Rows to claim now, oldest slot first: queued, running with an expired lease,
        failed with a retry that has come — of ``jobs`` only, when given (a replica asks
        for the jobs it runs, so rows of jobs it does not define never fill its limit)."""
        ...

    def run_list(self, namespace: str, job: str | None, limit: int) -> Operation[list[RunRecord]]:
        """Ledger rows, newest slot first."""
        ...

    def run_list_many(
        self, namespace: str, jobs: Sequence[str], limit: int, *, output: bool = True
    ) -> Operation[list[list[RunRecord]]]:
        """:meth:`run_list` of each of ``jobs`` (its newest ``limit`` rows, newest slot
        first), in input order, in one round trip. Without ``output`` the rows come without
        it (``None``): the bulk of a ledger row, which a reader of many jobs' health never
        shows, is then neither sent nor decoded."""
        ...

    def run_running(
        self, namespace: str, jobs: Sequence[str], limit: int
    ) -> Operation[list[RunRecord]]:
        """The rows in state ``running`` (their lease expired or not) among the newest
        ``limit`` rows of each of ``jobs``: what :meth:`run_list_many` of ``jobs`` holds
        of the runs in progress, by job then newest slot first, in one round trip and
        without reading the other rows — the SQL stores through an index of the running
        rows alone, Redis by the state of each job's newest ``limit`` rows."""
        ...

    def run_prune(self, namespace: str, keep: int, older_than_us: int) -> Operation[int]:
        """Delete final rows beyond the newest ``keep`` per job or older than the age."""
        ...

    def run_prune_job(
        self,
        namespace: str,
        job: str,
        keep: int,
        older_than_us: int,
        limit: int,
        dry_run: bool = False,
    ) -> Operation[int]:
        """Retention of one job: delete up to ``limit`` of its *finished* rows that are
        beyond its newest ``keep`` finished rows (by slot) **and** finished more than
        ``older_than_us`` ago (store clock), oldest slot first; return how many. With
        ``dry_run``, how many it would delete (at most ``limit``), deleting nothing.

        A finished row is in a final state and not waiting for a retry: a row ``queued``,
        ``running`` (even with an expired lease), or ``failed`` with ``retry_at_us`` set
        is never deleted and does not count among the ``keep``. The work is bounded by
        ``limit``, so a large backlog is pruned over several calls, each one short; other
        jobs and namespaces are untouched. A row's slot is never later than its finish,
        so a backend may bound its search by the slot as well."""
        ...

    def run_prune_jobs(
        self, namespace: str, rules: Sequence[tuple[str, int, int]], limit: int
    ) -> Operation[list[int]]:
        """:meth:`run_prune_job` for many jobs in one round trip: ``rules`` are ``(job,
        keep, older_than_us)``; up to ``limit`` rows of each job; how many went, per job,
        in input order. Each job's deletion is atomic on its own."""
        ...

    def job_delete(self, namespace: str, job: str, dry_run: bool = False) -> Operation[bool]:
        """Delete the job's row (definition, pause flag, progress) unless the job has a
        ``queued`` or ``running`` run; whether it was deleted — ``False``, changing
        nothing, when it has such a run or no row. With ``dry_run``, whether it would be.
        The job's run rows and its job lease stay: prune the runs afterwards
        (:meth:`run_prune_job` with ``keep`` 0 and age 0), as ``fleetcron prune --jobs``
        does; the lease row keeps the job's fences increasing should it come back."""
        ...

    def job_register(
        self, namespace: str, jobs: Sequence[tuple[str, str, str]]
    ) -> Operation[list[JobRecord | None]]:
        """Upsert the definitions of ``(job, definition, fingerprint)`` in one round trip
        (each job on its own); returns each job's row as it was before, in input order."""
        ...

    def job_set_paused(self, namespace: str, job: str, paused: bool) -> Operation[bool]:
        """Pause or resume the job on every replica; ``False`` only when resuming a job the
        store has no row of (nothing changes).

        Pausing a job with no row records the pause ahead of its registration: a row
        without a definition or fingerprint (as a claim or trigger that comes first makes),
        which :meth:`job_register` fills in and keeps paused — the job starts paused.
        Resuming a row that holds nothing but such a pause (no definition, fingerprint,
        high-water mark, success or failure, and no run row of the job) deletes it
        (:func:`fleetcron.stores.ledger.placeholder`). Each is atomic on its own; SQL
        backends other than SQLite resume in two statements, a registration or pause
        between them leaving the row as it would after both."""
        ...

    def job_get(self, namespace: str, job: str) -> Operation[JobRecord | None]:
        """One job row."""
        ...

    def job_list(self, namespace: str) -> Operation[list[JobRecord]]:
        """Every job row of the namespace, by name, all at once (see :meth:`job_page`)."""
        ...

    def job_page(
        self, namespace: str, after: str, limit: int, *, definitions: bool = True
    ) -> Operation[list[JobRecord]]:
        """Up to ``limit`` job rows of the namespace named after ``after`` (``""``: from
        the first), in the store's order of names; fewer than ``limit``: no more. Page
        after page (each after the last name of the one before) meets every row that
        stays in the namespace once; each page is one read, not a snapshot of the whole.
        Without ``definitions`` a row's definition is ``""``: the bulk of the row, which a
        reader of progress or fingerprints never needs, is neither sent nor decoded. The
        order is bytewise (Python's ``str``) but on PostgreSQL, whose order is the
        database's collation (a page is a range of the primary key's index). Redis lists
        the namespace's job keys (a SCAN) and etcd reads its job table for each page.
        :mod:`fleetcron.stores.job_pages` reads them all."""
        ...

    def job_namespaces(self) -> Operation[list[str]]:
        """The namespaces that hold a job row, sorted: where a reader that found no job
        in the namespace it was given may have meant to look. Reads every job row's
        namespace (SQL) or scans the keyspace (Redis, as ``job_list`` does)."""
        ...

    # -- replica heartbeats -----------------------------------------------------------------
    def replica_beat(
        self,
        namespace: str,
        replica: ReplicaInfo,
        ttl_us: int,
        retain_us: int = REPLICA_RETAIN_US,
    ) -> Operation[ReplicaRecord]:
        """Upsert the replica's row at the store's now: ``last_seen = now``, ``expires =
        now + ttl``, its other fields from ``replica``; ``started`` is kept when the row
        exists (else ``now``). In the same step, delete a bounded number of the namespace's
        other rows that expired more than ``retain_us`` ago. Returns the row written."""
        ...

    def replica_list(
        self, namespace: str, gone_within_us: int = REPLICA_RETAIN_US
    ) -> Operation[list[ReplicaRecord]]:
        """The replica rows of ``namespace`` with ``expires + gone_within_us > now`` (``0``:
        only the live ones), by replica id, each with the store's now."""
        ...

    def replica_leave(self, namespace: str, replica_id: str) -> Operation[bool]:
        """Delete the replica's row (a clean stop); ``False`` when there was none."""
        ...


class SyncStore(Protocol):
    """A connected store driven synchronously. Safe to share between threads."""

    @property
    def url(self) -> str:
        """The store's URL with any password redacted."""
        ...

    @property
    def capabilities(self) -> Capability:
        """What the backend promises."""
        ...

    @property
    def ops(self) -> Operations:
        """The backend's operations."""
        ...

    def run(self, operation: Operation[T]) -> T:
        """Carry out ``operation``; raises :class:`~fleetcron.errors.StoreError` on failure."""
        ...

    def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the names applied."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class AsyncStore(Protocol):
    """A connected store driven by asyncio."""

    @property
    def url(self) -> str:
        """The store's URL with any password redacted."""
        ...

    @property
    def capabilities(self) -> Capability:
        """What the backend promises."""
        ...

    @property
    def ops(self) -> Operations:
        """The backend's operations."""
        ...

    async def run(self, operation: Operation[T]) -> T:
        """Carry out ``operation``; raises :class:`~fleetcron.errors.StoreError` on failure."""
        ...

    async def migrate(self) -> list[str]:
        """Apply pending schema migrations; return the names applied."""
        ...

    async def close(self) -> None:
        """Release the connection."""
        ...


def acquired_record(
    namespace: str, name: str, holder: str, fence: int, now: int, ttl_us: int, least_us: int
) -> LeaseRecord:
    """The lease an acquire at store time ``now`` wrote: everything but the fence and the
    clock follows from the terms, so a backend returns only those two."""
    return LeaseRecord(
        namespace=namespace,
        name=name,
        holder=holder,
        fence=fence,
        acquired_us=now,
        expires_us=now + ttl_us,
        min_until_us=now + least_us,
        now_us=now,
    )


def conflict_answer(claim: SlotClaim, job: JobRecord | None, now: int) -> ClaimResult | None:
    """The ``conflict`` answer to ``claim`` when the job's registered definition (``job``,
    its row) is another than the claimer's, else ``None``. The rule comes after
    ``not_due`` and before every other one: a conflicting claim writes nothing."""
    stored = job.fingerprint if job is not None else None
    if claim.slot_us > now or not claim.conflicts_with(stored):
        return None
    return ClaimResult(
        job=claim.job, slot_us=claim.slot_us, status="conflict", stored_fingerprint=stored
    )


def as_text(value: object) -> str:
    """A text column or reply as ``str``: drivers answer some as bytes (PyMySQL for
    VARBINARY, redis-py always), which went in as UTF-8."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)


def connect_error(url: str, error: FleetcronError | None) -> FleetcronError:
    """The error of a failed connect to ``url``, keeping the category of the driver's
    error (refused credentials are not "try again later"; a bad parameter is not either)."""
    if error is None:
        return StoreUnavailable(f"cannot connect to {url}")
    if isinstance(error, StoreError) and type(error) is not StoreError:
        return type(error)(f"cannot connect to {url}: {error.message}")
    if isinstance(error, StoreError):
        return StoreUnavailable(f"cannot connect to {url}: {error.message}")
    return error


async def opened(store: AsyncStore, opening: Awaitable[None]) -> None:
    """Await ``opening``; a store that could not be opened (a schema refused, a failed
    migration) is closed, not left with its connection."""
    try:
        await opening
    except BaseException:
        await store.close()
        raise
