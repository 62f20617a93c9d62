"""What the monitor remembers of each job's health between two watches, so that a watch
judges again only the jobs whose inputs changed.

A job's health (:func:`fleetcron.health.assess`) is a function of its row, its recent
ledger rows and the store's clock. Each watch reads every job row and every lease row
anyway (one round trip each); a job is judged again — its ledger read and assessed — only
when

- its row changed (definition, pause, progress: the high-water slot, the last success, the
  last failure, the time it was registered), or its job lease row did: every claim of one
  of its slots moves the lease's fence, and taking or releasing the lease changes its
  holder or its expiry, so a run that starts, ends or is recovered shows there;
- the store's clock reached the moment its health may change with nothing written
  (:func:`fleetcron.health.unchanged_until`: its next slot, the end of a slot's grace, and
  every watch while a run of it is in the ledger as running);
- or the last full watch is :data:`FULL_EVERY_US` old: what the row and the lease do not
  show (a slot queued by ``trigger`` or ``backfill`` and not claimed yet, ledger rows
  deleted by ``prune`` or retention) is seen within that long.

An idle namespace of 10,000 jobs is then two reads and a comparison per job each watch,
instead of 20 more reads and 10,000 assessments. A judged health is kept as it was judged:
its ``now_us`` is the time of that judgement, not of the watch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleetcron.health import JobHealth, unchanged_until
from fleetcron.models import JobRecord, LeaseRecord, RunRecord, job_lease_name

__all__ = ["FULL_EVERY_US", "HealthCache"]

FULL_EVERY_US = 600_000_000
"""How often (on the store's clock) every job is judged again whatever its rows say."""

_Key = tuple[object, ...]


def _key(row: JobRecord, lease: LeaseRecord | None) -> _Key:
    """What the job's health is judged from, as the row and the job lease show it."""
    held = (lease.fence, lease.holder, lease.expires_us) if lease is not None else None
    return (
        row.definition,
        row.paused,
        row.high_water_us,
        row.last_success_us,
        row.last_failure_us,
        row.updated_us,
        held,
    )


@dataclass(frozen=True, slots=True)
class _Entry:
    key: _Key
    health: JobHealth
    until_us: int | None  # judged again from then on (None: only when its rows change)


class HealthCache:
    """Each job's last judged health, with what it was judged from.

    :meth:`split` tells a watch which jobs to judge again; :meth:`keep` records their new
    health. :attr:`judged` counts the jobs judged again at the last watch (0 when nothing
    changed: what a test can hold a watch to)."""

    def __init__(self, *, full_every_us: int = FULL_EVERY_US) -> None:
        self.full_every_us = full_every_us
        self.judged = 0
        self._entries: dict[str, _Entry] = {}
        self._keys: dict[str, _Key] = {}  # the keys of the watch under way
        self._full_at: int | None = None  # the store's time of the last full watch

    def clear(self) -> None:
        """Forget everything: the next watch judges every job (a new watch term, or ledger
        rows deleted by this replica's retention)."""
        self._entries.clear()
        self._keys.clear()
        self._full_at = None

    def forget(self, jobs: Iterable[str]) -> None:
        """Judge ``jobs`` afresh at the next watch (ledger rows of theirs were deleted)."""
        for job in jobs:
            self._entries.pop(job, None)

    def split(
        self, rows: Sequence[JobRecord], leases: Sequence[LeaseRecord], now_us: int
    ) -> tuple[list[JobHealth], list[JobRecord]]:
        """The kept health of the jobs of ``rows`` whose inputs did not change, and the rows
        of the others (to be judged again and given to :meth:`keep`)."""
        full = (
            self._full_at is None
            or now_us < self._full_at
            or now_us - self._full_at >= self.full_every_us
        )
        if full:
            self._full_at = now_us
            self._entries.clear()
        by_name: Mapping[str, LeaseRecord] = {lease.name: lease for lease in leases}
        entries, kept = self._entries, {}
        healths: list[JobHealth] = []
        stale: list[JobRecord] = []
        self._keys = {}
        for row in rows:
            key = _key(row, by_name.get(job_lease_name(row.job)))
            entry = entries.get(row.job)
            if (
                entry is not None
                and entry.key == key
                and entry.health.now_us <= now_us
                and (entry.until_us is None or now_us < entry.until_us)
            ):
                kept[row.job] = entry
                healths.append(entry.health)
            else:
                self._keys[row.job] = key
                stale.append(row)
        self._entries = kept  # jobs gone from the store are forgotten
        self.judged = 0
        return healths, stale

    def keep(
        self,
        rows: Sequence[JobRecord],
        ledgers: Sequence[Sequence[RunRecord]],
        healths: Sequence[JobHealth],
    ) -> None:
        """Record the health judged of each job of ``rows`` (given by :meth:`split`) from its
        ``ledgers``."""
        for row, runs, health in zip(rows, ledgers, healths, strict=True):
            key = self._keys.pop(row.job, None)
            if key is not None:
                self._entries[row.job] = _Entry(key, health, unchanged_until(row, runs, health))
            self.judged += 1
