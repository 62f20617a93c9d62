"""The job registry a fleet keeps: jobs defined with ``@fleet.job(...)`` or added from a
jobs file, shared by :class:`~fleetcron.Fleet` and :class:`~fleetcron.AsyncFleet`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fleetcron.errors import ConfigurationError
from fleetcron.job_options import job_spec
from fleetcron.jobspec import JobSpec

__all__ = ["JobRegistry"]

F = TypeVar("F", bound=Callable[..., Any])


class JobRegistry:
    """Job definitions by name, in the order they were added."""

    def __init__(self) -> None:
        self._jobs: list[JobSpec] = []

    @property
    def jobs(self) -> tuple[JobSpec, ...]:
        """The jobs registered with :meth:`job` or :meth:`add_job`."""
        return tuple(self._jobs)

    def add_job(self, spec: JobSpec) -> None:
        """Register a job definition (e.g. from a jobs file); names must be unique."""
        if any(existing.name == spec.name for existing in self._jobs):
            raise ConfigurationError(f"Fleet.job: job {spec.name!r} is defined twice")
        self._jobs.append(spec)

    def job(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Decorator: schedule the function as a job (keys as in the jobs file).

        ``@fleet.job(schedule="*/5 * * * *", timezone="Europe/Berlin", lock_at_most="20m")``;
        the function takes a :class:`~fleetcron.RunContext`; ``async def`` works too;
        ``isolate="process"`` runs it in a child process (a module-level function).
        """

        if callable(name):
            raise ConfigurationError(
                "Fleet.job needs its options: write @fleet.job(every=...) or "
                "@fleet.job(schedule=...), not a bare @fleet.job"
            )
        reserved = sorted({"call", "command", "where"} & options.keys())
        if reserved:
            raise ConfigurationError(
                f"Fleet.job: {', '.join(reserved)} cannot be given: the decorated function "
                "is the job's call"
            )

        def decorate(func: F) -> F:
            reference = getattr(func, "__name__", None)
            if name is None and not isinstance(reference, str):
                raise ConfigurationError(
                    f"Fleet.job: {func!r} has no __name__; give the job a name"
                )
            job_name = name or str(reference).replace("_", "-")
            self.add_job(job_spec(job_name, where="Fleet.job", call=func, **options))
            return func

        return decorate
