"""Python jobs for examples/jobs.toml (found because the jobs file's directory is searched)."""

from __future__ import annotations

__all__ = ["tick"]


def tick(ctx: object) -> None:
    """Print what fleetcron tells the job about this run."""
    job = getattr(ctx, "job", "?")
    slot = getattr(ctx, "slot", "?")
    fence = getattr(ctx, "fence", "?")
    print(f"tick: job={job} slot={slot} fence={fence}")  # noqa: T201
