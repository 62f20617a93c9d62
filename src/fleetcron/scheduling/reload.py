"""What a reload of the jobs file changed (``fleetcron run`` on SIGHUP,
:meth:`~fleetcron.scheduler.AsyncScheduler.reload`), by job name, and its log line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetcron._log import log

__all__ = ["Reload"]


@dataclass(frozen=True, slots=True)
class Reload:
    """What :meth:`~fleetcron.scheduler.AsyncScheduler.reload` changed, by job name."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]

    @classmethod
    def between(
        cls, current: Mapping[str, object], local: Mapping[str, str], new: Mapping[str, str]
    ) -> Reload:
        """The change from the ``current`` jobs (their fingerprints in ``local``) to the
        ``new`` ones (name: fingerprint)."""
        return cls(
            added=tuple(sorted(set(new) - set(current))),
            changed=tuple(sorted(n for n in new if n in current and new[n] != local[n])),
            removed=tuple(sorted(set(current) - set(new))),
        )

    def log(self) -> None:
        """Say what the reload changed (``jobs_reloaded``)."""
        log.warning(
            "jobs reloaded: %d added, %d changed, %d removed",
            len(self.added),
            len(self.changed),
            len(self.removed),
            extra={
                "action": "jobs_reloaded",
                "added": ",".join(self.added),
                "changed": ",".join(self.changed),
                "removed": ",".join(self.removed),
            },
        )
