"""Who claims a slot first: the replicas of a namespace share out the slots, so that N
replicas do not all race for every slot.

Every replica in claim mode that runs the same job definitions (the same
``jobs_fingerprint`` in the replica table) is a member of the ring; a slot's *owner* is the
member picked by a hash of ``(job, slot)``. A replica claims the slots it owns as soon as
they are due. A slot another member owns is only looked at after a hand-over delay, and
then only if the store says it is still free (one read for many slots): the slot of a
replica that is down, frozen or behind is run all the same, a little later, by whichever
replica gets to it first.

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

__all__ = ["HANDOVER_US", "Ring"]

HANDOVER_US = 250_000
"""How long after it is due a slot owned by another replica is first looked at."""


class Ring:
    """The members that share out the slots, as this replica last read them."""

    def __init__(self, me: str, jobs_fingerprint: str) -> None:
        self.me = me
        self.jobs_fingerprint = jobs_fingerprint
        self.members: tuple[str, ...] = (me,)
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
            self.version += 1

    def owns(self, job: str, slot_us: int) -> bool:
        """Whether this replica is the slot's owner (always, alone in the ring)."""
        members = self.members
        if len(members) == 1:
            return True
        # CRC-32 of "job\0slot" spreads (job, slot) evenly enough; every member computes
        # the same owner from the same member list. The job's part is computed once.
        prefix = self._prefixes.get(job)
        if prefix is None:
            prefix = self._prefixes[job] = zlib.crc32(f"{job}\0".encode())
        index = zlib.crc32(str(slot_us).encode(), prefix) % len(members)
        return members[index] == self.me
