"""Exit statuses of the ``fleetcron`` command (documented in docs/cli.md)."""

from __future__ import annotations

__all__ = [
    "EXIT_CANNOT_EXECUTE",
    "EXIT_INTERNAL",
    "EXIT_LEASE_LOST",
    "EXIT_NONE_RUNNING",
    "EXIT_NOT_FOUND",
    "EXIT_STORE_REFUSED",
    "EXIT_STORE_UNAVAILABLE",
    "EXIT_TIMEOUT",
    "EXIT_UNHEALTHY",
    "EXIT_USAGE",
]

# fleetcron's own failures never exit 1: under `fleetcron exec` a 1 is the command's.

EXIT_UNHEALTHY = 1  # `status --check` and `doctor` only: a job is unhealthy / a check failed
EXIT_NONE_RUNNING = 1  # `cancel` only: the job had no running attempt to ask (as pkill's 1)
EXIT_USAGE = 2  # bad option, duration, name or URL; nothing was touched
EXIT_STORE_UNAVAILABLE = 75  # EX_TEMPFAIL: the store could not be reached; command not started
EXIT_LEASE_LOST = 76  # the lease was lost while the command ran; its process group was killed
EXIT_STORE_REFUSED = 78  # EX_CONFIG: credentials, permissions, no such database, not a store
EXIT_INTERNAL = 70  # EX_SOFTWARE: any other failure of the store or of fleetcron itself
EXIT_TIMEOUT = 124  # --timeout elapsed; the command was killed (as coreutils timeout)
EXIT_CANNOT_EXECUTE = 126  # the command exists but cannot be executed
EXIT_NOT_FOUND = 127  # the command was not found
