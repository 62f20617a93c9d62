"""The one error hierarchy of fleetcron.

Every error fleetcron raises derives from :class:`FleetcronError`, so
``except fleetcron.FleetcronError`` always works::

    FleetcronError
    ├── ConfigurationError      bad URL, option, duration or name (raised before any state changes)
    ├── StoreError              the store failed; the driver's exception is in ``__cause__``
    │   ├── StoreUnavailable    cannot connect, or the connection broke (retryable)
    │   ├── StoreRefused        the store refused this client: credentials, permissions,
    │   │   │                   no such database, not a database (not retryable)
    │   │   ├── StoreReplaced   the SQLite file was deleted or replaced since it was opened
    │   │   └── StoreMissing    no fleetcron store there yet, and the command creates none
    │   └── SchemaError         the schema is missing, newer than this code, or broken
    ├── LockError               carries ``name``
    │   ├── LockBusy            another holder has the lease (``lock()`` only)
    │   └── LeaseLost           renewal failed or the local deadline passed; work cancelled
    └── RunCancelled            ``ctx.raise_if_cancelled()``: the run was asked to stop

Contention is not an error for ``try_lock`` and ``locked``: they return ``None`` / skip.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "FleetcronError",
    "LeaseLost",
    "LockBusy",
    "LockError",
    "RunCancelled",
    "SchemaError",
    "StoreError",
    "StoreMissing",
    "StoreRefused",
    "StoreReplaced",
    "StoreUnavailable",
]


class FleetcronError(Exception):
    """A fleetcron operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__ or type(self).__name__)

    @property
    def message(self) -> str:
        """The one-line, human-readable description."""
        return str(self.args[0])


class ConfigurationError(FleetcronError):
    """The configuration is invalid."""


class StoreError(FleetcronError):
    """The store failed to carry out an operation."""


class StoreUnavailable(StoreError):
    """The store cannot be reached."""


class StoreRefused(StoreError):
    """The store refused this client: wrong credentials, missing permissions, no such
    database, or a file that is not a database. Trying again will not help."""


class StoreReplaced(StoreRefused):
    """The store this process opened is no longer the one its URL names: the SQLite file
    at the path was deleted, renamed away or replaced by another file since it was opened.
    Nothing more is done in the file the process holds — the rest of the fleet no longer
    sees it; a new process opens whatever is at the path now."""


class StoreMissing(StoreRefused):
    """There is no fleetcron store at the URL — no SQLite file, or a database without
    fleetcron's tables — and the command only uses one that exists: a command that only
    reads (``status``, ``runs``, ``locks``, ``web``…) never creates a store, so a mistyped
    URL is said instead of answered from an empty store made for the occasion."""


class SchemaError(StoreError):
    """The store's schema is missing or does not match this version of fleetcron."""


class LockError(FleetcronError):
    """A lock operation failed."""

    def __init__(self, name: str, message: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockBusy(LockError):
    """Another holder has the lease."""

    def __init__(self, name: str, message: str | None = None, *, holder: str | None = None) -> None:
        super().__init__(name, message or f"lock {name!r} is held by another holder")
        self.holder = holder


class LeaseLost(LockError):
    """The lease was lost while the protected work ran; the work was cancelled."""

    def __init__(self, name: str, message: str | None = None, *, fence: int | None = None) -> None:
        super().__init__(name, message or f"lease on {name!r} was lost")
        self.fence = fence


class RunCancelled(FleetcronError):
    """The run was asked to stop (lease lost, timeout, cancel requested, shutdown)."""

    def __init__(self, message: str | None = None, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
