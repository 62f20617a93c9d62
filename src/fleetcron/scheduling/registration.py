"""Registration: a replica writes its job definitions in the store when it starts (and
when a reload adds or changes jobs), so that ``status``, the dashboard and every other
replica see one picture, and a definition another replica holds is reported, never merged.

Each replica registers in its own random order, in batches of :data:`REGISTER_BATCH`
(one round trip each), so replicas starting together do not queue on the same job rows.
With many jobs, one read of what the store holds comes first and only the definitions it
does not hold are written: a restart, or the twentieth replica of a fleet, writes nothing.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from fleetcron._log import log, says_progress
from fleetcron.jobspec import JobSpec
from fleetcron.models import JobRecord
from fleetcron.schedules import AtSchedule, iso_utc
from fleetcron.stores.base import AsyncStore

__all__ = ["REGISTER_BATCH", "first_cursor", "register"]

REGISTER_BATCH = 500
"""Job definitions per registration round trip."""

Planned = Callable[[JobSpec, "JobRecord | None", int], None]
"""Called for each job once its definition is in the store, with the row as it was
before (``None``: the job is new to the fleet) and the store's time."""


async def register(
    store: AsyncStore,
    namespace: str,
    specs: Sequence[JobSpec],
    fingerprints: Mapping[str, str],
    *,
    store_now: int,
    planned: Planned,
) -> None:
    """Write the definitions of ``specs`` (``fingerprints``: this replica's, by name),
    calling ``planned`` for each job as its row is known. Over a thousand jobs, or a
    second, it says how it went in one line (``jobs_registered``)."""
    began = time.monotonic()
    tally: Counter[str] = Counter()

    def counted(spec: JobSpec, before: JobRecord | None, now: int) -> None:
        if before is None:
            tally["new"] += 1
        elif before.fingerprint == fingerprints[spec.name]:
            tally["unchanged"] += 1
        else:
            tally["changed"] += 1
        planned(spec, before, now)

    await _register(store, namespace, specs, fingerprints, store_now, counted)
    elapsed = time.monotonic() - began
    if says_progress(len(specs), elapsed):
        log.info(
            "registered %s job(s) in %.1f s: %s new, %s changed, %s unchanged",
            f"{len(specs):,}",
            elapsed,
            f"{tally['new']:,}",
            f"{tally['changed']:,}",
            f"{tally['unchanged']:,}",
            extra={
                "action": "jobs_registered",
                "jobs": len(specs),
                "new": tally["new"],
                "changed": tally["changed"],
                "unchanged": tally["unchanged"],
                "seconds": round(elapsed, 3),
            },
        )


async def _register(
    store: AsyncStore,
    namespace: str,
    specs: Sequence[JobSpec],
    fingerprints: Mapping[str, str],
    store_now: int,
    planned: Planned,
) -> None:
    pending = list(specs)
    random.shuffle(pending)
    many = len(pending) > REGISTER_BATCH
    if many:
        pending = await _unheld(store, namespace, pending, fingerprints, store_now, planned)
    while pending:
        chunk, pending = pending[:REGISTER_BATCH], pending[REGISTER_BATCH:]
        befores = await store.run(
            store.ops.job_register(
                namespace,
                [
                    (
                        spec.name,
                        json.dumps(spec.definition(), sort_keys=True),
                        fingerprints[spec.name],
                    )
                    for spec in chunk
                ],
            )
        )
        for spec, before in zip(chunk, befores, strict=True):
            planned(spec, before, store_now)
        written = sum(
            1
            for spec, before in zip(chunk, befores, strict=True)
            if before is not None and before.fingerprint == fingerprints[spec.name]
        )
        if many and pending and 4 * written >= len(chunk):
            # Other replicas are registering the same definitions right now (a fleet
            # starting together): read again what they wrote rather than queue on their
            # rows to write it once more.
            pending = await _unheld(store, namespace, pending, fingerprints, store_now, planned)


async def _unheld(
    store: AsyncStore,
    namespace: str,
    specs: list[JobSpec],
    fingerprints: Mapping[str, str],
    store_now: int,
    planned: Planned,
) -> list[JobSpec]:
    """Of ``specs``, the ones whose definition the store does not hold (one read); the
    others are planned from their stored row."""
    stored = {row.job: row for row in await store.run(store.ops.job_list(namespace))}
    unheld = []
    for spec in specs:
        row = stored.get(spec.name)
        if row is not None and row.fingerprint == fingerprints[spec.name]:
            planned(spec, row, store_now)
        else:
            unheld.append(spec)
    return unheld


def first_cursor(spec: JobSpec, high_water: int | None, store_now: int) -> int:
    """Where planning of a job just registered starts: a job new to the fleet now, a known
    one after its last slot (``high_water``), so slots missed while every replica was down
    meet the catch-up policy. A one-time job whose moment passed before any replica
    planned it is said so, not silently dropped."""
    if high_water is not None:
        return high_water
    if isinstance(spec.schedule, AtSchedule) and spec.schedule.moment_us <= store_now:
        log.warning(
            "%s: its one time (at = %s) had passed when it was first scheduled (store "
            "time %s); it will not run — set a future time, or trigger it by hand",
            spec.name,
            iso_utc(spec.schedule.moment_us),
            iso_utc(store_now),
            extra={"action": "job_at_in_past", "job": spec.name},
        )
    return store_now
