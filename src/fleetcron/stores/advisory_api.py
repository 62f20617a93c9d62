"""What a store that can hold session advisory locks offers (lock mode ``advisory``).

A backend brings the capability as a method of its stores, ``advisory_locks()``, returning
an :class:`AdvisoryLocks`; the lease code asks a store for it and names no backend (today
PostgreSQL alone has it: ``stores/sql/advisory.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fleetcron.models import AdvisoryHold, LeaseRecord
from fleetcron.stores.base import Operation

__all__ = ["AdvisoryLocks", "AdvisorySessionLike", "advisory_locks_of"]


class AdvisorySessionLike(Protocol):
    """A connection of the holder's own holding one session advisory lock."""

    key: int
    """The advisory lock's key."""
    pid: int
    """The server process that holds the lock."""
    fd: int
    """The session's socket: readable when the server says something, or closes it."""

    def acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> LeaseRecord | None:
        """Write the name's lease row on this session; ``None`` when it may not be taken."""
        ...

    def ended(self) -> str | None:
        """``None`` while the session is alive, else why it ended."""
        ...

    def close(self) -> None:
        """Give the lock back and close the session (idempotent)."""
        ...


class AdvisoryLocks(Protocol):
    """A store's session advisory locks."""

    def open(self, namespace: str, name: str) -> AdvisorySessionLike | None:
        """A session holding the name's advisory lock; ``None`` when another holds it."""
        ...

    def held(self, namespace: str, names: Sequence[str]) -> Operation[list[AdvisoryHold]]:
        """The advisory locks held now on the keys of ``names``, with their sessions."""
        ...

    def mark(self, holder: str) -> str:
        """``holder`` marked as an advisory holder's (its lease row says so)."""
        ...


def advisory_locks_of(store: object) -> AdvisoryLocks | None:
    """The advisory locks of ``store`` (a sync store, or the one a threaded async store
    wraps); ``None`` when its backend has none."""
    inner = getattr(store, "sync", store)
    factory = getattr(inner, "advisory_locks", None)
    return factory() if callable(factory) else None
