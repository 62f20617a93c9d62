"""Job functions that leak the store's password in their errors (importable by name, so
an isolated child process finds them)."""

from __future__ import annotations

from fleetcron.context import RunContext

PASSWORD = "S3cretPassw0rd"
URL = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test"
SUMMARY_LIMIT = 4096  # bytes of an isolated child's failure summary


def leaks_the_url(ctx: RunContext) -> None:
    raise RuntimeError(f"cannot connect to {URL} (password {PASSWORD})")


def leaks_across_the_cut(ctx: RunContext) -> None:
    """The summary ``RuntimeError: xxx…S3cretPa|ssw0rd`` is cut inside the password."""
    head = "RuntimeError: "
    raise RuntimeError("x" * (SUMMARY_LIMIT - len(head) - 8) + PASSWORD)
