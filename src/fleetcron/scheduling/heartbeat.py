"""Heartbeats: each running replica keeps a row of its own in its namespace's replica table,
so ``fleetcron status``, ``doctor`` and the dashboard can show which replicas are up.

A replica beats once when it has registered its jobs, then every ``every_s``; each beat
sets the row's expiry to the store's now + ``TTL_BEATS`` beats, so a replica counts as up
for as long as the store says its row has not expired — two missed beats are forgiven. On a
clean stop it deletes its row; a replica that crashed is listed as gone until the retention
(:data:`~fleetcron.models.REPLICA_RETAIN_US`) has passed, then a later beat of any replica
of the namespace deletes its row (docs/design/replicas.md).

A failed beat is not an error of its own: the scheduler's loop already reports a store
outage, once. It is logged at DEBUG and the next beat tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
from collections.abc import Mapping

from fleetcron._log import log
from fleetcron._version import __version__
from fleetcron.errors import StoreError
from fleetcron.models import MEMBERS_LEASE, ReplicaInfo, ReplicaRecord
from fleetcron.stores.base import AsyncStore

__all__ = ["DEFAULT_HEARTBEAT_S", "TTL_BEATS", "Heartbeat", "jobs_fingerprint", "replica_info"]

DEFAULT_HEARTBEAT_S = 10.0
TTL_BEATS = 3  # a row expires this many beat intervals after the beat that wrote it


def jobs_fingerprint(fingerprints: Mapping[str, str]) -> str:
    """A stable hash (32 hex digits) of the ``job name → definition fingerprint`` pairs a
    replica runs, equal on replicas that run the same definitions whatever their order."""
    canonical = json.dumps(sorted(fingerprints.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def replica_info(mode: str, fingerprints: Mapping[str, str]) -> ReplicaInfo:
    """What this process says of itself: a new replica id ``host:pid:<random>`` — the
    holder style of :func:`fleetcron.lease.new_holder`, but with a public random part of
    its own, never a lease's secret token — and its version, mode and jobs."""

    host, pid = socket.gethostname(), os.getpid()
    return ReplicaInfo(
        replica_id=f"{host}:{pid}:{secrets.token_hex(4)}",
        host=host,
        pid=pid,
        version=__version__,
        mode=mode,
        jobs_fingerprint=jobs_fingerprint(fingerprints),
    )


_ANNOUNCE_TRIES = 20  # the members lease is held for an instant: a few tries get it


class Heartbeat:
    """The beats of one replica: :meth:`beat` once, :meth:`start` the periodic ones,
    :meth:`leave` on a clean stop. ``last`` is the row the latest successful beat wrote."""

    def __init__(
        self, store: AsyncStore, namespace: str, info: ReplicaInfo, *, every_s: float
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.info = info
        self.every_s = every_s
        self.ttl_us = round(TTL_BEATS * every_s * 1e6)
        self.last: ReplicaRecord | None = None
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> ReplicaRecord | None:
        """Write the row now; ``None`` when the store could not be reached."""
        try:
            self.last = await self.store.run(
                self.store.ops.replica_beat(self.namespace, self.info, self.ttl_us)
            )
        except StoreError as exc:
            log.debug("heartbeat failed: %s", exc, extra={"action": "replica_beat_failed"})
            return None
        return self.last

    def start(self) -> None:
        """Beat every ``every_s`` in a task of its own until :meth:`leave`."""
        if self._task is None:
            self._task = asyncio.create_task(self._beating(), name="fleetcron-heartbeat")

    async def _beating(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.beat()
            except Exception:
                # A bug must not end the beats silently: say so, go on.
                log.exception("heartbeat failed", extra={"action": "replica_beat_failed"})

    async def announce(self) -> None:
        """Say that the membership changed (this replica joined or left): take the members
        lease for an instant, moving its fence — the version the other replicas check
        before they read the whole table (:meth:`Handover.read_ring
        <fleetcron.scheduling.handover.Handover.read_ring>`). Taken by another replica
        this instant, it is tried again a few times; failing, the others still read the
        table in full every :data:`~fleetcron.scheduling.handover.RING_FULL_EVERY_S`."""
        for attempt in range(_ANNOUNCE_TRIES):
            try:
                taken = await self.store.run(
                    self.store.ops.lease_acquire(
                        self.namespace, MEMBERS_LEASE, self.info.replica_id, 1, 0
                    )
                )
            except StoreError as exc:
                log.debug(
                    "announcing a membership change failed: %s",
                    exc,
                    extra={"action": "members_announce_failed"},
                )
                return
            if taken is not None:
                return
            await asyncio.sleep(0.05 * (attempt + 1))

    async def leave(self) -> None:
        """Stop beating and delete the row (a row that cannot be deleted expires)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self.store.run(self.store.ops.replica_leave(self.namespace, self.info.replica_id))
        except StoreError as exc:
            log.debug(
                "leaving the replica table failed (the row expires by itself): %s",
                exc,
                extra={"action": "replica_leave_failed"},
            )
            return
        if self.info.mode == "claim":
            await self.announce()
