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
- Rows are never deleted except by ``lease_prune`` of names unused for a given age.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fleetcron.models import LeaseRecord

__all__ = [
    "AsyncStore",
    "Capability",
    "Operation",
    "Operations",
    "SqlResult",
    "Statement",
    "SyncStore",
    "drive",
    "drive_async",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Capability(enum.Flag):
    """What a backend can promise, checked at start."""

    NONE = 0
    CROSS_HOST = enum.auto()  # safe across machines (SQLite and memory: no)
    SERVER_CLOCK = enum.auto()  # lease time comes from a store server's clock
    PERSISTENT = enum.auto()  # survives a restart of the process


@dataclass(frozen=True, slots=True)
class Statement:
    """One unit of I/O an operation asks its runner to carry out.

    ``name`` names a query in the backend's ``.sql`` file or a Lua script; ``params`` are
    bound, never interpolated.
    """

    name: str
    params: Mapping[str, object] = field(default_factory=dict)
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SqlResult:
    """Rows returned by a statement (empty when it returns none) and rows it matched."""

    rows: list[tuple[Any, ...]]
    rowcount: int


Operation = Generator[Statement, Any, T]


def drive(operation: Operation[T], execute: Any) -> T:
    """Run ``operation`` to completion, executing each statement with ``execute``."""
    try:
        statement = next(operation)
        while True:
            statement = operation.send(execute(statement))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        operation.close()


async def drive_async(operation: Operation[T], execute: Any) -> T:
    """Async twin of :func:`drive`: ``execute`` is a coroutine function."""
    try:
        statement = next(operation)
        while True:
            statement = operation.send(await execute(statement))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        operation.close()


class Operations(Protocol):
    """The operations of one backend. Each returns an :data:`Operation` to drive."""

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        """Take the lease if free at the store's clock; ``None`` when held."""
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


def rows_to_records(namespace: str, rows: Iterable[tuple[Any, ...]]) -> list[LeaseRecord]:
    """Map ``(name, holder, fence, acquired_us, expires_us, min_until_us, now_us)`` rows."""
    return [
        LeaseRecord(
            namespace=namespace,
            name=_text(row[0]),
            holder=_text(row[1]),
            fence=int(row[2]),
            acquired_us=int(row[3]),
            expires_us=int(row[4]),
            min_until_us=int(row[5]),
            now_us=int(row[6]),
        )
        for row in rows
    ]


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    return str(value)
