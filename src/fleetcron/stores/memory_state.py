"""The in-memory store's state, and the step that changes it atomically: shared by its
rooms (leases, the ledger, replicas, the queue)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetcron.models import JobRecord, LeaseRecord, ReplicaRecord, RunRecord
from fleetcron.stores.memory_queue import QueueTables
from fleetcron.stores.memory_step import Step

__all__ = ["State", "Step", "StepFunction", "atomic"]


@dataclass(slots=True)
class State:
    leases: dict[tuple[str, str], LeaseRecord]
    runs: dict[tuple[str, str, int], RunRecord] = field(default_factory=dict)
    jobs: dict[tuple[str, str], JobRecord] = field(default_factory=dict)
    replicas: dict[tuple[str, str], ReplicaRecord] = field(default_factory=dict)
    queues: QueueTables = field(default_factory=QueueTables)


StepFunction = Callable[[State, int], Any]


def atomic(fn: StepFunction) -> Step:
    """``fn`` as the one step of an operation: applied to the state atomically."""
    return Step(fn)
