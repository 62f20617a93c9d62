"""Records from the rows a store answers, each field read by the name of its column.

One :class:`RowDecoder` per record type says which columns the record is made of and how
(:data:`LEASES`, :data:`RUNS`, :data:`JOBS`, …). Every backend's answers go through it:

- a SQL result carries its column names (``SqlResult.columns``, from the driver's result
  description), so a statement may return its columns in any order, and more columns than
  a record needs (a claim's status, a batch item's position);
- a Redis script returns a flat list whose layout its header declares once (``-- row
  run: {job, slot_us, …}``, :data:`~fleetcron.stores.redis.scripts.REPLY_ROWS`), and the
  reply is read with those names.

A column is known by its name, or by the name behind an ``r_`` prefix: the PL/pgSQL
functions name their result columns ``r_<column>``, since an output parameter may not
share a name with a column their body reads. A column a record needs and the answer
lacks, or names twice, is a :class:`~fleetcron.errors.SchemaError` that names the record
and the column.

Names are resolved to positions once per tuple of column names (a statement's answers all
have the same), then each row is read with one ``itemgetter`` — or as it is, when its
columns are the record's, in order. Nothing is looked up by name per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any, Generic, TypeVar

from fleetcron.errors import SchemaError
from fleetcron.models import JobRecord, LeaseRecord, ReplicaRecord, RunRecord
from fleetcron.queue_models import CheckpointRecord, QueueItem, QueueStats
from fleetcron.stores.base import acquired_record, as_text
from fleetcron.stores.sql.statements import SqlResult

__all__ = [
    "ACQUIRED",
    "CHECKPOINTS",
    "ITEMS",
    "JOBS",
    "LEASES",
    "REPLICAS",
    "RUNS",
    "STATS",
    "RowDecoder",
    "column_key",
    "position",
]

R = TypeVar("R")
Row = Sequence[Any]
Reader = Callable[[Row], Any]

_PREFIX = "r_"


def column_key(name: str) -> str:
    """The name a column is known by: ``name`` without the ``r_`` of a PL/pgSQL
    function's result column."""
    return name[len(_PREFIX) :] if name.startswith(_PREFIX) else name


def position(names: Sequence[str], column: str, record: str) -> int:
    """Where ``column`` is among the column ``names`` of an answer holding ``record``
    rows; :class:`SchemaError` when it is not there, or there twice."""
    found = [index for index, name in enumerate(names) if column_key(name) == column]
    if not found:
        listed = ", ".join(names) if names else "none"
        raise SchemaError(
            f"{record} rows need the column {column!r}, which the store's answer lacks "
            f"(its columns: {listed})"
        )
    if len(found) > 1:
        raise SchemaError(
            f"the store's answer names the column {column!r} of {record} rows twice "
            f"(its columns: {', '.join(names)})"
        )
    return found[0]


class RowDecoder(Generic[R]):
    """How records of one type are read from rows: the ``columns`` they are made of, by
    name, and ``build``, which makes the records of a sequence of value tuples, each in
    the order of ``columns``, given the caller's context first (the namespace, …).

    ``record`` names the type in errors. ``build`` takes every row at once, so that it
    unpacks each tuple in one loop instead of being called per row. A record is made of
    two columns or more (a one-column answer is read as it is)."""

    __slots__ = ("_build", "_last", "_readers", "columns", "record")

    def __init__(
        self, record: str, columns: tuple[str, ...], build: Callable[..., list[R]]
    ) -> None:
        if len(columns) < 2:
            raise ValueError(f"{record} rows of {len(columns)} column(s) need no decoder")
        self.record = record
        self.columns = columns
        self._build = build
        # Column names of an answer -> how to read a row of it (None: as it is).
        self._readers: dict[tuple[str, ...], Reader | None] = {}
        # The names last read and their reader, in one tuple (one read, whatever the
        # thread): answers to one statement often share their names' tuple itself (the
        # PostgreSQL store's, a script's layout), which a tuple's hash would read whole.
        self._last: tuple[tuple[str, ...] | None, Reader | None] = (None, None)

    def _reader(self, names: tuple[str, ...]) -> Reader | None:
        try:
            reader = self._readers[names]
        except KeyError:
            at = tuple(position(names, column, self.record) for column in self.columns)
            # None: the row is the record's columns, in order, and is read as it is.
            reader = None if at == tuple(range(len(names))) else itemgetter(*at)
            self._readers[names] = reader
        self._last = (names, reader)
        return reader

    # Each method below looks at _last itself, not through a call: every claim, renewal
    # and outcome decodes an answer of one row, where a call costs as much as the rest.

    def decode(self, names: tuple[str, ...], rows: Iterable[Row], *context: Any) -> list[R]:
        """The records of ``rows``, whose columns are ``names``."""
        last = self._last
        read = last[1] if last[0] is names else self._reader(names)
        return self._build(*context, rows if read is None else map(read, rows))

    def one(self, names: tuple[str, ...], row: Row, *context: Any) -> R:
        """The record of one ``row``, whose columns are ``names``."""
        last = self._last
        read = last[1] if last[0] is names else self._reader(names)
        return self._build(*context, (row if read is None else read(row),))[0]

    def all(self, result: SqlResult, *context: Any) -> list[R]:
        """The records of every row of ``result``."""
        rows = result.rows
        if not rows:
            return []
        names = result.columns
        last = self._last
        read = last[1] if last[0] is names else self._reader(names)
        return self._build(*context, rows if read is None else map(read, rows))

    def first(self, result: SqlResult, *context: Any) -> R | None:
        """The record of the first row of ``result``; ``None`` when it has none."""
        rows = result.rows
        if not rows:
            return None
        names = result.columns
        last = self._last
        read = last[1] if last[0] is names else self._reader(names)
        return self._build(*context, (rows[0] if read is None else read(rows[0]),))[0]


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _text(value: Any) -> str | None:
    return None if value is None else as_text(value)


def _acquired(
    namespace: str,
    name: str,
    holder: str,
    ttl_us: int,
    least_us: int,
    values: Iterable[Row],
) -> list[LeaseRecord]:
    return [
        acquired_record(namespace, name, holder, int(fence), int(now_us), ttl_us, least_us)
        for fence, now_us in values
    ]


ACQUIRED = RowDecoder("acquired lease", ("fence", "now_us"), _acquired)
"""A lease just taken: its fence and the store's clock (the rest follows from the terms
of the acquire, its context: namespace, name, holder, ttl_us, least_us)."""


def _leases(namespace: str, values: Iterable[Row]) -> list[LeaseRecord]:
    return [
        LeaseRecord(
            namespace=namespace,
            name=as_text(name),
            holder=as_text(holder),
            fence=int(fence),
            acquired_us=int(acquired_us),
            expires_us=int(expires_us),
            min_until_us=int(min_until_us),
            now_us=int(now_us),
        )
        for name, holder, fence, acquired_us, expires_us, min_until_us, now_us in values
    ]


LEASES = RowDecoder(
    "lease",
    ("name", "holder", "fence", "acquired_us", "expires_us", "min_until_us", "now_us"),
    _leases,
)
"""Lease rows (context: the namespace)."""


def _runs(namespace: str, values: Iterable[Row]) -> list[RunRecord]:
    return [
        RunRecord(
            namespace=namespace,
            job=as_text(job),
            slot_us=int(slot_us),
            state=as_text(state),
            attempt=int(attempt),
            fence=int(fence),
            holder=as_text(holder),
            run_id=as_text(run_id),
            trigger=as_text(trigger),
            started_us=_int(started_us),
            finished_us=_int(finished_us),
            expires_us=_int(expires_us),
            retry_at_us=_int(retry_at_us),
            cancel_requested=bool(cancel_requested),
            exit_code=_int(exit_code),
            error=None if error is None else as_text(error),
            output=None if output is None else as_text(output),
            now_us=int(now_us),
        )
        for (
            job,
            slot_us,
            state,
            attempt,
            fence,
            holder,
            run_id,
            trigger,
            started_us,
            finished_us,
            expires_us,
            retry_at_us,
            cancel_requested,
            exit_code,
            error,
            output,
            now_us,
        ) in values
    ]


RUNS = RowDecoder(
    "run",
    (
        "job",
        "slot_us",
        "state",
        "attempt",
        "fence",
        "holder",
        "run_id",
        "trigger",
        "started_us",
        "finished_us",
        "expires_us",
        "retry_at_us",
        "cancel_requested",
        "exit_code",
        "error",
        "output",
        "now_us",
    ),
    _runs,
)
"""Run rows of the ledger (context: the namespace)."""


def _jobs(namespace: str, values: Iterable[Row]) -> list[JobRecord]:
    return [
        JobRecord(
            namespace=namespace,
            job=as_text(job),
            paused=bool(paused),
            definition=as_text(definition),
            fingerprint=as_text(fingerprint),
            high_water_us=_int(high_water_us),
            last_success_us=_int(last_success_us),
            last_failure_us=_int(last_failure_us),
            updated_us=int(updated_us),
            now_us=int(now_us),
        )
        for (
            job,
            paused,
            definition,
            fingerprint,
            high_water_us,
            last_success_us,
            last_failure_us,
            updated_us,
            now_us,
        ) in values
    ]


JOBS = RowDecoder(
    "job",
    (
        "job",
        "paused",
        "definition",
        "fingerprint",
        "high_water_us",
        "last_success_us",
        "last_failure_us",
        "updated_us",
        "now_us",
    ),
    _jobs,
)
"""Job rows (context: the namespace)."""


def _replicas(namespace: str, values: Iterable[Row]) -> list[ReplicaRecord]:
    return [
        ReplicaRecord(
            namespace=namespace,
            replica_id=as_text(replica_id),
            host=as_text(host),
            pid=int(pid),
            version=as_text(version),
            mode=as_text(mode),
            jobs_fingerprint=as_text(jobs_fingerprint),
            started_us=int(started_us),
            last_seen_us=int(last_seen_us),
            expires_us=int(expires_us),
            now_us=int(now_us),
        )
        for (
            replica_id,
            host,
            pid,
            version,
            mode,
            jobs_fingerprint,
            started_us,
            last_seen_us,
            expires_us,
            now_us,
        ) in values
    ]


REPLICAS = RowDecoder(
    "replica",
    (
        "replica_id",
        "host",
        "pid",
        "version",
        "mode",
        "jobs_fingerprint",
        "started_us",
        "last_seen_us",
        "expires_us",
        "now_us",
    ),
    _replicas,
)
"""Replica heartbeat rows (context: the namespace)."""


def _items(namespace: str, queue: str, values: Iterable[Row]) -> list[QueueItem]:
    return [
        QueueItem(
            namespace=namespace,
            queue=queue,
            item_id=int(item_id),
            dedupe_key=_text(dedupe_key),
            payload=as_text(payload),
            state=as_text(state),
            attempts=int(attempts),
            max_attempts=int(max_attempts),
            fence=int(fence),
            holder=_text(holder),
            available_us=int(available_us),
            created_us=int(created_us),
            finished_us=_int(finished_us),
            error=_text(error),
            now_us=int(now_us),
        )
        for (
            item_id,
            dedupe_key,
            payload,
            state,
            attempts,
            max_attempts,
            fence,
            holder,
            available_us,
            created_us,
            finished_us,
            error,
            now_us,
        ) in values
    ]


ITEMS = RowDecoder(
    "queue item",
    (
        "id",
        "dedupe_key",
        "payload",
        "state",
        "attempts",
        "max_attempts",
        "fence",
        "holder",
        "available_us",
        "created_us",
        "finished_us",
        "error",
        "now_us",
    ),
    _items,
)
"""Work-queue item rows (context: the namespace and the queue); ``id`` is the item's id."""


def _stats(namespace: str, values: Iterable[Row]) -> list[QueueStats]:
    # The counts may come as decimals: MySQL's SUM.
    return [
        QueueStats(
            namespace=namespace,
            queue=as_text(queue),
            ready=int(ready),
            scheduled=int(scheduled),
            claimed=int(claimed),
            done=int(done),
            dead=int(dead),
            oldest_us=_int(oldest_us),
            now_us=int(now_us),
        )
        for queue, ready, scheduled, claimed, done, dead, oldest_us, now_us in values
    ]


STATS = RowDecoder(
    "queue stats",
    ("queue", "ready", "scheduled", "claimed", "done", "dead", "oldest_us", "now_us"),
    _stats,
)
"""How each queue stands (context: the namespace)."""


def _checkpoints(namespace: str, name: str, values: Iterable[Row]) -> list[CheckpointRecord]:
    return [
        CheckpointRecord(
            namespace=namespace,
            name=name,
            value=as_text(value),
            fence=int(fence),
            updated_us=int(updated_us),
            now_us=int(now_us),
        )
        for value, fence, updated_us, now_us in values
    ]


CHECKPOINTS = RowDecoder("checkpoint", ("value", "fence", "updated_us", "now_us"), _checkpoints)
"""Checkpoint rows (context: the namespace and the checkpoint's name)."""
