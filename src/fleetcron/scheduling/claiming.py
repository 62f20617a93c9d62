"""What a scheduling pass writes: the slots catch-up gives up, recorded ``missed`` in
batches, and the claims, sent in one round trip per lease length — after a cheap read has
dropped the waiting slots other replicas already have when the last claims found many
taken (:func:`sift`)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from fleetcron._log import log
from fleetcron.metrics import Metrics
from fleetcron.models import ClaimResult, RunNote, SlotClaim
from fleetcron.schedules import iso_utc
from fleetcron.scheduling.planning import MISSED_RECORD_LIMIT, Plan, PlannedJob
from fleetcron.stores.base import AsyncStore
from fleetcron.stores.ledger import MISSED_ERROR

__all__ = [
    "RECORD_BATCH",
    "SIFT_AT_LEAST",
    "missed_line",
    "pick_batch",
    "record_missed",
    "send_claims",
    "sift",
]

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
    after_outage: bool = False,
) -> None:
    """Record ``missed`` the slots catch-up gives up, for every job of a pass together:
    one round trip per :data:`RECORD_BATCH` slots, not one per slot (a replica that fell
    behind must not fall further behind recording it). Each job whose slots this replica
    recorded gets one log line — how many, between which slots, and why: a job resumed
    from the fleet's last slot missed them while no replica ran, ``after_outage`` while
    the store could not be reached, else the fleet was behind. Slots another replica had
    recorded already are not counted again."""
    notes: list[RunNote] = []
    counted: list[PlannedJob] = []
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
        counted.append(job)
    written: list[bool] = []
    for start in range(0, len(notes), RECORD_BATCH):
        chunk = notes[start : start + RECORD_BATCH]
        written += await store.run(store.ops.run_record_many(namespace, chunk))
    mine: dict[str, list[int]] = {}
    for note, wrote in zip(notes, written, strict=True):
        if wrote:
            mine.setdefault(note.job, []).append(note.slot_us)
    for job in counted:
        spec = job.spec
        slots = mine.get(spec.name)
        if not slots:
            continue  # another replica recorded (and said) them
        if metrics is not None:
            metrics.missed(spec.name, len(slots))
        if job.resumed:
            why = "while no replica ran"
        elif after_outage:
            why = "while the store could not be reached"
        else:
            why = "behind schedule: no replica started them in time"
        missed_line(spec.name, slots, why, spec.catchup)


def missed_line(job: str, slots: Sequence[int], why: str, catchup: str) -> None:
    """Say in one line that ``slots`` (oldest first) of ``job`` were recorded missed."""
    first, last = iso_utc(slots[0]), iso_utc(slots[-1])
    log.warning(
        "%s: %s missed %s (%s), catchup = %s",
        job,
        _slots(len(slots)),
        why,
        first if first == last else f"{first} to {last}",
        catchup,
        extra={"action": "slot_missed", "job": job, "count": len(slots)},
    )


def _slots(count: int) -> str:
    return "1 slot" if count == 1 else f"{count} slots"


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


def pick_batch(
    pending: deque[SlotClaim],
    claims: list[SlotClaim],
    blocked: list[SlotClaim],
    room: int,
    *,
    abandoned: Collection[str],
    finishing: Collection[str],
) -> None:
    """Fill ``claims`` from ``pending`` up to ``room``, in order: a slot of a job whose
    abandoned run still runs here goes to ``blocked``; at most one exclusive claim per job
    per batch (the others would only find the job's lease taken by the first), none for a
    job whose outcome is on its way — those wait, in order, for the next batch."""
    exclusive = {c.job for c in claims if c.exclusive}
    waiting: list[SlotClaim] = []
    while pending and len(claims) < room:
        claim = pending.popleft()
        if claim.job in abandoned:
            blocked.append(claim)
            continue
        if claim.exclusive and (claim.job in exclusive or claim.job in finishing):
            waiting.append(claim)
            continue
        if claim.exclusive:
            exclusive.add(claim.job)
        claims.append(claim)
    pending.extendleft(reversed(waiting))


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
