"""The in-memory store: one process, the reference implementation of the contract.

Its "store clock" is the injected :class:`~fleetcron.clock.Clock` (``FakeClock`` in tests).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any, TypeVar

from fleetcron.clock import SYSTEM_CLOCK, Clock
from fleetcron.models import (
    REPLICA_RETAIN_US,
    LeaseRecord,
    ReplicaInfo,
    ReplicaRecord,
)
from fleetcron.stores.base import (
    REPLICA_PRUNE_LIMIT,
    Capability,
    Operation,
    Statement,
    acquired_record,
    drive,
)
from fleetcron.stores.memory_ledger import MemoryLedger
from fleetcron.stores.memory_queue import MemoryQueue
from fleetcron.stores.memory_state import State, atomic
from fleetcron.stores.memory_step import Step
from fleetcron.stores.url import StoreURL

__all__ = ["AsyncMemoryStore", "MemoryOperations", "MemoryStore", "open_async", "open_sync"]

T = TypeVar("T")


class _MemoryLeases:
    """Lease operations over a dict; each yields one step run atomically by the store."""

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        def step(state: State, now: int) -> LeaseRecord | None:
            current = state.leases.get((namespace, name))
            if current is not None and current.expires_us > now:
                return None
            fence = max(current.fence + 1 if current else 0, now)
            record = acquired_record(namespace, name, holder, fence, now, ttl_us, least_us)
            state.leases[(namespace, name)] = record
            return record

        result: LeaseRecord | None = yield atomic(step)
        return result

    def _owned(
        self, state: State, now: int, key: tuple[str, str], holder: str, fence: int
    ) -> LeaseRecord | None:
        current = state.leases.get(key)
        if current is None or current.holder != holder or current.fence != fence:
            return None
        return current if current.expires_us > now else None

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        def step(state: State, now: int) -> LeaseRecord | None:
            current = self._owned(state, now, (namespace, name), holder, fence)
            if current is None:
                return None
            record = replace(
                current, expires_us=max(now + ttl_us, current.min_until_us), now_us=now
            )
            state.leases[(namespace, name)] = record
            return record

        result: LeaseRecord | None = yield atomic(step)
        return result

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        def step(state: State, now: int) -> bool:
            current = self._owned(state, now, (namespace, name), holder, fence)
            if current is None:
                return False
            expires = max(now, current.min_until_us)
            state.leases[(namespace, name)] = replace(current, expires_us=expires, now_us=now)
            return True

        result: bool = yield atomic(step)
        return result

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        def step(state: State, now: int) -> LeaseRecord | None:
            current = state.leases.get((namespace, name))
            return replace(current, now_us=now) if current else None

        result: LeaseRecord | None = yield atomic(step)
        return result

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        def step(state: State, now: int) -> list[LeaseRecord]:
            return sorted(
                (replace(r, now_us=now) for (ns, _), r in state.leases.items() if ns == namespace),
                key=lambda record: record.name,
            )

        result: list[LeaseRecord] = yield atomic(step)
        return result

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        def step(state: State, now: int) -> list[str]:
            limit = now - older_than_us
            doomed = [
                key
                for key, r in state.leases.items()
                if key[0] == namespace
                and r.expires_us < limit
                and r.min_until_us < limit
                and r.fence < now
            ]
            if not dry_run:
                for key in doomed:
                    del state.leases[key]
            return sorted(name for _, name in doomed)

        result: list[str] = yield atomic(step)
        return result


class _MemoryReplicas:
    """Replica heartbeat rows over a dict."""

    def replica_beat(
        self,
        namespace: str,
        replica: ReplicaInfo,
        ttl_us: int,
        retain_us: int = REPLICA_RETAIN_US,
    ) -> Operation[ReplicaRecord]:
        def step(state: State, now: int) -> ReplicaRecord:
            key = (namespace, replica.replica_id)
            doomed = sorted(
                (r.expires_us, k)
                for k, r in state.replicas.items()
                if k[0] == namespace and k != key and r.expires_us < now - retain_us
            )
            for _, doomed_key in doomed[:REPLICA_PRUNE_LIMIT]:
                del state.replicas[doomed_key]
            before = state.replicas.get(key)
            record = ReplicaRecord(
                namespace=namespace,
                replica_id=replica.replica_id,
                host=replica.host,
                pid=replica.pid,
                version=replica.version,
                mode=replica.mode,
                jobs_fingerprint=replica.jobs_fingerprint,
                started_us=before.started_us if before is not None else now,
                last_seen_us=now,
                expires_us=now + ttl_us,
                now_us=now,
            )
            state.replicas[key] = record
            return record

        result: ReplicaRecord = yield atomic(step)
        return result

    def replica_list(
        self, namespace: str, gone_within_us: int = REPLICA_RETAIN_US
    ) -> Operation[list[ReplicaRecord]]:
        def step(state: State, now: int) -> list[ReplicaRecord]:
            rows = [
                replace(r, now_us=now)
                for (ns, _), r in state.replicas.items()
                if ns == namespace and r.expires_us + gone_within_us > now
            ]
            return sorted(rows, key=lambda row: row.replica_id)

        result: list[ReplicaRecord] = yield atomic(step)
        return result

    def replica_leave(self, namespace: str, replica_id: str) -> Operation[bool]:
        def step(state: State, _now: int) -> bool:
            return state.replicas.pop((namespace, replica_id), None) is not None

        result: bool = yield atomic(step)
        return result


class MemoryOperations(_MemoryLeases, MemoryLedger, _MemoryReplicas, MemoryQueue):
    """Every operation of the in-memory store."""


class MemoryStore:
    """Sync in-memory store. Share one instance between clients to model a fleet."""

    capabilities = Capability.NONE

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.url = "memory://"
        self.ops = MemoryOperations()
        self.clock = clock
        self._state = State(leases={})
        self._lock = threading.Lock()

    def _execute(self, statement: Statement) -> Any:
        if not isinstance(statement, Step):
            raise TypeError(f"the memory store cannot run {statement!r}")
        return statement.fn(self._state, self.clock.wall_us())

    def async_twin(self) -> AsyncMemoryStore:
        """The async face of this store, sharing its state (no thread hop: no I/O)."""
        return AsyncMemoryStore(self)

    def run(self, operation: Operation[T]) -> T:
        with self._lock:
            return drive(operation, self._execute)

    def migrate(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class AsyncMemoryStore:
    """Async face of a :class:`MemoryStore` (no I/O, so no thread hop)."""

    capabilities = Capability.NONE

    def __init__(self, store: MemoryStore | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.sync = store if store is not None else MemoryStore(clock=clock)
        self.url = self.sync.url
        self.ops = self.sync.ops

    async def run(self, operation: Operation[T]) -> T:
        return self.sync.run(operation)

    async def migrate(self) -> list[str]:
        return []

    async def close(self) -> None:
        await asyncio.sleep(0)


def open_sync(url: StoreURL, *, create: bool, auto_migrate: bool) -> MemoryStore:
    """The backend's entry point (:mod:`fleetcron.stores.backends`): a new, empty store."""
    return MemoryStore()


async def open_async(url: StoreURL, *, create: bool, migrate: bool) -> AsyncMemoryStore:
    """The backend's async entry point: a new, empty store."""
    return AsyncMemoryStore()
