"""Who claims a slot first: the replicas of a namespace share out the slots, so that N
replicas do not all race for every slot.

Every replica in claim mode that runs the same job definitions (the same
``jobs_fingerprint`` in the replica table) is a member of the ring; a slot's *owner* is the
member picked by a hash of ``(job, slot)``. A replica claims the slots it owns as soon as
they are due. A slot another member owns is only looked at after a hand-over delay, and
then only if the store says it is still free (one read for many slots): the slot of a
replica that is down, frozen or behind is run all the same, a little later, by whichever
replica gets to it first.

A slot has an owner and, among more than three members, exactly :data:`BACKUPS` backups,
picked by the same hash and spread over the members (the slots of a replica that dies fall
on everyone, not on one neighbour): the first backup looks at the slot after the
hand-over delay, the second after twice that, and no other member looks at it at all — a
slot costs the store a bounded number of reads whatever the number of replicas. When the
owner and both backups are gone, the slot is looked at once the ring has dropped them
(the replicas' rows expire): each job's newest slot still within its deadline is looked
at again by its new owner and backups (:meth:`Handover.read_ring
<fleetcron.scheduling.handover.Handover.read_ring>`).

Nothing here is a guarantee: the store decides every claim. Two replicas that disagree
about the members (one started a second ago) both claim some slots, and the store gives
each to one of them; a slot nobody thinks it owns waits for the hand-over. The ring is
read again every heartbeat interval, and sooner (at most once a second) when a claim of a
slot this replica thought its own was answered ``taken``: the members changed.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from fleetcron.models import ReplicaRecord

__all__ = ["BACKUPS", "HANDOVER_US", "OTHER", "Ring"]

HANDOVER_US = 250_000
"""How long after it is due a slot owned by another replica is first looked at."""
BACKUPS = 2
"""The members besides its owner that look at a slot."""
OTHER = BACKUPS + 1
"""The rank of a member that is neither a slot's owner nor one of its backups."""


class Ring:
    """The members that share out the slots, as this replica last read them."""

    def __init__(self, me: str, jobs_fingerprint: str) -> None:
        self.me = me
        self.jobs_fingerprint = jobs_fingerprint
        self.members: tuple[str, ...] = (me,)
        self._index = 0  # this replica's place in members
        self.version = 0
        """Counts the changes of :attr:`members`: an owner worked out before a change is
        worked out again."""
        self._prefixes: dict[str, int] = {}  # the CRC-32 of each job's part of the key

    def update(self, rows: Iterable[ReplicaRecord]) -> None:
        """Take the live claim-mode replicas running this replica's definitions; this
        replica is a member whatever its own row says (its beat may have failed)."""
        live = {
            row.replica_id
            for row in rows
            if row.alive and row.mode == "claim" and row.jobs_fingerprint == self.jobs_fingerprint
        }
        live.add(self.me)
        members = tuple(sorted(live))
        if members != self.members:
            self.members = members
            self._index = members.index(self.me)
            self.version += 1

    def owns(self, job: str, slot_us: int) -> bool:
        """Whether this replica is the slot's owner (always, alone in the ring)."""
        return self.rank(job, slot_us) == 0

    def rank(self, job: str, slot_us: int) -> int:
        """This replica's place for the slot: 0 its owner, 1 and 2 its first and second
        backup, :data:`OTHER` neither (only among more than three members)."""
        members = self.members
        count = len(members)
        if count == 1:
            return 0
        # CRC-32 of "job\0slot" spreads (job, slot) evenly enough; every member computes
        # the same owner from the same member list. The job's part is computed once.
        prefix = self._prefixes.get(job)
        if prefix is None:
            prefix = self._prefixes[job] = zlib.crc32(f"{job}\0".encode())
        digest = zlib.crc32(str(slot_us).encode(), prefix)
        offset = (self._index - digest) % count  # this replica's distance from the owner
        if offset == 0 or count <= OTHER:
            return offset
        # The backups' distances from the owner: two distinct ones in 1..count-1, from
        # the hash's higher bits, so a dead owner's slots fall on every member.
        rest = digest // count
        first = 1 + rest % (count - 1)
        second = 1 + (first + rest // (count - 1) % (count - 2)) % (count - 1)
        if offset == first:
            return 1
        if offset == second:
            return 2
        return OTHER
