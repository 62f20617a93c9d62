"""What a scheduling pass writes: the slots catch-up gives up, recorded ``missed`` in
batches, and the claims, sent in one round trip per lease length — after a cheap read has
dropped the waiting slots other replicas already have when the last claims found many
taken (:func:`sift`)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace

from fleetcron._log import log
from fleetcron.jobspec import JobSpec
from fleetcron.metrics import Metrics
from fleetcron.models import ClaimResult, RunNote, SlotClaim
from fleetcron.scheduling.planning import MISSED_RECORD_LIMIT, Plan, PlannedJob
from fleetcron.stores.base import AsyncStore
from fleetcron.stores.ledger import MISSED_ERROR

__all__ = ["RECORD_BATCH", "SIFT_AT_LEAST", "record_missed", "send_claims", "sift"]

RECORD_BATCH = 1000
"""Missed slots recorded per round trip."""
SIFT_AT_LEAST = 512
"""Waiting slots looked at per sift, whatever the room."""


async def record_missed(
    store: AsyncStore,
    namespace: str,
    plans: Sequence[tuple[PlannedJob, Plan]],
    *,
    conflicts: Mapping[str, object],
    metrics: Metrics | None,
) -> None:
    """Record ``missed`` the slots catch-up gives up, for every job of a pass together:
    one round trip per :data:`RECORD_BATCH` slots, not one per slot (a replica that fell
    behind must not fall further behind recording it)."""
    notes: list[RunNote] = []
    counted: list[tuple[JobSpec, int]] = []
    for job, plan in plans:
        spec = job.spec
        # A superseded definition's slots are not the job's: nothing is recorded for them
        # (a row would keep the governing replica from a slot both schedules have).
        if not plan.missed or spec.name in conflicts:
            continue
        notes += (
            RunNote(spec.name, slot, "missed", MISSED_ERROR, "schedule")
            for slot in plan.missed[-MISSED_RECORD_LIMIT:]
        )
        counted.append((spec, len(plan.missed)))
    for start in range(0, len(notes), RECORD_BATCH):
        chunk = notes[start : start + RECORD_BATCH]
        await store.run(store.ops.run_record_many(namespace, chunk))
    for spec, count in counted:
        if metrics is not None:
            metrics.missed(spec.name, count)
        log.warning(
            "%s: %d slot(s) missed: %s (catchup = %s)",
            spec.name,
            count,
            MISSED_ERROR,
            spec.catchup,
            extra={"action": "slot_missed", "job": spec.name, "count": count},
        )


async def sift(
    store: AsyncStore,
    namespace: str,
    pending: deque[SlotClaim],
    room: int,
    catching_up: set[tuple[str, int]],
) -> None:
    """Drop waiting slots other replicas already have, learnt in one cheap read, so that
    claims (which lock and write) go to slots still free."""
    head = list(itertools.islice(pending, max(4 * room, SIFT_AT_LEAST)))
    # Fresh slots only (they carry a deadline): a retry or a recovered attempt has a row
    # already, which run_settled counts, but it is still to be claimed.
    asked = [(c.job, c.slot_us) for c in head if c.deadline_us is not None]
    if not asked:
        return
    settled = await store.run(store.ops.run_settled(namespace, asked))
    if not settled:
        return
    for _ in head:  # nothing else touches the queue while this pass awaits
        pending.popleft()
    pending.extendleft(reversed([c for c in head if (c.job, c.slot_us) not in settled]))
    catching_up -= settled


async def send_claims(
    store: AsyncStore,
    namespace: str,
    holder: str,
    claims: Sequence[SlotClaim],
    *,
    ttl_by_job: Mapping[str, int],
    fingerprints: Mapping[str, str],
    answers: list[tuple[SlotClaim, ClaimResult]],
    metrics: Metrics | None,
) -> None:
    """Claim ``claims``, one round trip per lease length (usually one in all), appending
    each answer to ``answers`` as it comes — a store failure midway leaves the answers
    already had there, for the caller to put the others back. Each claim is sent with
    this replica's definition of its job (``fingerprints``): the store refuses it while
    the registered definition is another (``conflict``)."""
    for ttl in sorted(set(ttl_by_job.values())):
        batch = [c for c in claims if ttl_by_job[c.job] == ttl]
        signed = [
            c
            if c.fingerprint == fingerprints[c.job]
            else replace(c, fingerprint=fingerprints[c.job])
            for c in batch
        ]
        results = await store.run(store.ops.run_claim(namespace, signed, holder, ttl))
        answers += zip(batch, results, strict=True)
        if metrics is not None:
            metrics.claimed(results)


def _signed(claim: SlotClaim, fingerprint: str) -> SlotClaim:
    """``claim`` with this replica's current definition of its job (signed when made,
    again only if the definition changed since)."""
    return claim if claim.fingerprint == fingerprint else replace(claim, fingerprint=fingerprint)
