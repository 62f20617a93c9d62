"""Exit statuses of the ``fleetcron`` command (documented in docs/cli.md)."""

from __future__ import annotations

__all__ = [
    "EXIT_CANNOT_EXECUTE",
    "EXIT_LEASE_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_STORE_UNAVAILABLE",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
]

EXIT_USAGE = 2  # bad option, duration, name or URL; nothing was touched
EXIT_STORE_UNAVAILABLE = 75  # EX_TEMPFAIL: the store could not be reached; command not started
EXIT_LEASE_LOST = 76  # the lease was lost while the command ran; its process group was killed
EXIT_TIMEOUT = 124  # --timeout elapsed; the command was killed (as coreutils timeout)
EXIT_CANNOT_EXECUTE = 126  # the command exists but cannot be executed
EXIT_NOT_FOUND = 127  # the command was not found
