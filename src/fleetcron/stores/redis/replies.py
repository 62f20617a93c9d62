"""The Redis scripts' replies as records.

A script that returns a row returns a flat list whose layout its header declares once
(``-- row run: {job, slot_us, …}``, read into
:data:`~fleetcron.stores.redis.scripts.REPLY_ROWS`). Each reply is read by those names with
the decoder of its record (:mod:`fleetcron.stores.rows`), the one the SQL stores' rows go
through: a script may reorder its reply as long as its header says so. A reply of
``false`` (no row) is ``None`` here, where a script may answer one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleetcron.models import JobRecord, LeaseRecord, ReplicaRecord, RunRecord
from fleetcron.queue_models import CheckpointRecord, QueueItem, QueueStats
from fleetcron.stores.redis.scripts import REPLY_ROWS
from fleetcron.stores.rows import (
    ACQUIRED,
    CHECKPOINTS,
    ITEMS,
    JOBS,
    LEASES,
    REPLICAS,
    RUNS,
    STATS,
)

__all__ = [
    "acquired_of",
    "checkpoint_of",
    "items_of",
    "job_of",
    "lease_of",
    "replica_of",
    "replicas_of",
    "run_of",
    "runs_of",
    "stats_of",
]

_ACQUIRED = REPLY_ROWS["acquired"]
_LEASE = REPLY_ROWS["lease"]
_RUN = REPLY_ROWS["run"]
_JOB = REPLY_ROWS["job"]
_REPLICA = REPLY_ROWS["replica"]
_ITEM = REPLY_ROWS["item"]
_CHECKPOINT = REPLY_ROWS["checkpoint"]
# A stats reply is of one queue, whose name the caller knows and puts before it.
_STATS = ("queue", *REPLY_ROWS["stats"])


def acquired_of(
    namespace: str, name: str, holder: str, ttl_us: int, least_us: int, reply: Any
) -> LeaseRecord | None:
    """A ``lease_acquire`` reply (fence and clock) as the lease taken, or ``None``."""
    if not reply:
        return None
    return ACQUIRED.one(_ACQUIRED, reply, namespace, name, holder, ttl_us, least_us)


def lease_of(namespace: str, reply: Any) -> LeaseRecord | None:
    """A lease row reply, or ``None``."""
    return LEASES.one(_LEASE, reply, namespace) if reply else None


def run_of(namespace: str, reply: Any) -> RunRecord:
    """A ``run_row`` reply."""
    return RUNS.one(_RUN, reply, namespace)


def runs_of(namespace: str, rows: Iterable[Any]) -> list[RunRecord]:
    """``run_row`` replies (a script's list of rows), decoded together."""
    return RUNS.decode(_RUN, rows, namespace)


def job_of(namespace: str, reply: Any) -> JobRecord | None:
    """A ``job_row`` reply, or ``None``."""
    return JOBS.one(_JOB, reply, namespace) if reply else None


def replica_of(namespace: str, reply: Any) -> ReplicaRecord:
    """A replica row reply."""
    return REPLICAS.one(_REPLICA, reply, namespace)


def replicas_of(namespace: str, rows: Iterable[Any]) -> list[ReplicaRecord]:
    """Replica row replies, decoded together."""
    return REPLICAS.decode(_REPLICA, rows, namespace)


def items_of(namespace: str, queue: str, rows: Iterable[Any]) -> list[QueueItem]:
    """``item_row`` replies (queue.lua), decoded together."""
    return ITEMS.decode(_ITEM, rows, namespace, queue)


def stats_of(namespace: str, queue: str, reply: Any) -> QueueStats:
    """A ``queue_stats`` reply (queue.lua) of ``queue``."""
    return STATS.one(_STATS, (queue, *reply), namespace)


def checkpoint_of(namespace: str, name: str, reply: Any) -> CheckpointRecord | None:
    """A ``checkpoint_get`` reply (checkpoints.lua), or ``None``."""
    return CHECKPOINTS.one(_CHECKPOINT, reply, namespace, name) if reply else None
