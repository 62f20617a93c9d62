"""fleetcron: scheduled jobs that run exactly once across a fleet of replicas.

The public surface is what ``__all__`` lists; everything else is private.
"""

from __future__ import annotations

from fleetcron._version import __version__
from fleetcron.clock import Clock, SystemClock
from fleetcron.context import RunContext
from fleetcron.errors import (
    ConfigurationError,
    FleetcronError,
    LeaseLost,
    LockBusy,
    LockError,
    RunCancelled,
    SchemaError,
    StoreError,
    StoreMissing,
    StoreRefused,
    StoreReplaced,
    StoreUnavailable,
)
from fleetcron.fleet import AsyncFleet
from fleetcron.lease import AsyncLease, Lease
from fleetcron.models import AdvisoryHold, DefinitionConflict, LeaseRecord, RunRecord
from fleetcron.queue import AsyncQueue, Claimed, Entry, Queue
from fleetcron.queue_models import QueueItem, QueueStats
from fleetcron.scheduler import AsyncScheduler
from fleetcron.sync import Fleet, Scheduler

__all__ = [
    "AdvisoryHold",
    "AsyncFleet",
    "AsyncLease",
    "AsyncQueue",
    "AsyncScheduler",
    "Claimed",
    "Clock",
    "ConfigurationError",
    "DefinitionConflict",
    "Entry",
    "Fleet",
    "FleetcronError",
    "Lease",
    "LeaseLost",
    "LeaseRecord",
    "LockBusy",
    "LockError",
    "Queue",
    "QueueItem",
    "QueueStats",
    "RunCancelled",
    "RunContext",
    "RunRecord",
    "Scheduler",
    "SchemaError",
    "StoreError",
    "StoreMissing",
    "StoreRefused",
    "StoreReplaced",
    "StoreUnavailable",
    "SystemClock",
    "__version__",
]
