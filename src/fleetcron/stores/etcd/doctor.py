"""What ``fleetcron doctor`` checks of an etcd cluster: its members, raised alarms, the
database's size against etcd's quota, and how many keys the store keeps
(:meth:`EtcdStore.doctor_facts <fleetcron.stores.etcd.store.EtcdStore.doctor_facts>`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fleetcron.doctor.findings import Finding
from fleetcron.stores.etcd.messages import Status

__all__ = ["EtcdFacts", "warn_at_open"]

log = logging.getLogger("fleetcron")

DEFAULT_QUOTA = 2 * 1024**3
"""etcd's default ``--quota-backend-bytes`` (2 GiB): at the quota it raises NOSPACE and
refuses every write. The cluster does not say its own quota, so this one is assumed."""
_SIZE_WARN = 0.6
# etcd keeps every key in memory and reads a listing whole: a namespace's ledger and queues
# beyond this many keys make listings slow and the database large.
_KEYS_WARN = 200_000
# A fleet writes revisions all the time (renewals, claims, heartbeats): this many kept
# since revision 1 means nothing compacts them.
_REVISIONS_WARN = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class EtcdFacts:
    """The cluster as the pinned member sees it: ``members`` (names or IDs), the member
    that answered (``endpoint``, its ``version``, the ``leader`` it follows, 0 when
    none), its database size and what of it is in use (bytes), the ``alarms`` raised in
    the cluster (``NOSPACE``, ``CORRUPT``, with the member's ID), how many ``keys``
    lie under the store's ``prefix``, the store's ``revision`` and whether its history was
    ever ``compacted``, the ``round_trip_s`` of its status call, and the
    bounds of its clock as offsets from this host's (``clock_low_s`` ≤ member − host <
    ``clock_high_s``; ``None``: no answer carried a ``Date`` header)."""

    endpoint: str
    version: str
    members: tuple[str, ...]
    leader: int
    db_size: int
    db_size_in_use: int
    alarms: tuple[str, ...]
    prefix: str
    keys: int
    revision: int
    compacted: bool
    round_trip_s: float
    clock_low_s: float | None
    clock_high_s: float | None

    def findings(self) -> list[Finding]:
        """Members, alarms, size, keys and clock, each a finding."""
        return [
            _members(self),
            _alarms(self),
            _size(self),
            _compaction(self),
            _keys(self),
            _clock(self),
        ]


def _members(facts: EtcdFacts) -> Finding:
    check = "etcd (members)"
    listed = f"{len(facts.members)} member(s) ({', '.join(facts.members)}); {facts.endpoint} "
    if not facts.leader:
        return Finding(
            level="fail",
            check=check,
            message=listed + "follows no leader",
            advice="the cluster has no quorum: nothing is granted, claimed or recorded until "
            "a majority of its members is back (docs/ha.md)",
        )
    if len(facts.members) < 3:
        return Finding(
            level="warn",
            check=check,
            message=listed + f"answers in {facts.round_trip_s * 1e3:.1f} ms (etcd {facts.version})",
            advice="with fewer than three members one member's loss stops the fleet; run "
            "three or five (docs/ha.md)",
        )
    answers = f"answers in {facts.round_trip_s * 1e3:.1f} ms (etcd {facts.version})"
    return Finding(level="ok", check=check, message=listed + answers)


def _alarms(facts: EtcdFacts) -> Finding:
    check = "etcd (alarms)"
    if not facts.alarms:
        return Finding(level="ok", check=check, message="no alarm raised")
    advice = (
        "etcd refuses every write while an alarm is raised: no lease is granted and no run "
        "recorded. NOSPACE: compact and defragment (etcdctl compact, etcdctl defrag), "
        "then etcdctl alarm disarm; CORRUPT: restore the member from a healthy one"
    )
    return Finding(
        level="fail", check=check, message=f"raised: {', '.join(facts.alarms)}", advice=advice
    )


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


def _size(facts: EtcdFacts) -> Finding:
    check = "etcd (database size)"
    found = f"{_mib(facts.db_size)} on disk, {_mib(facts.db_size_in_use)} in use"
    if facts.db_size >= _SIZE_WARN * DEFAULT_QUOTA:
        return Finding(
            level="warn",
            check=check,
            message=f"{found}: {facts.db_size / DEFAULT_QUOTA:.0%} of etcd's default 2 GiB quota",
            advice="at its quota (--quota-backend-bytes) etcd refuses every write; compact "
            "and defragment it, keep retention short (docs/backends.md)",
        )
    return Finding(level="ok", check=check, message=found)


def _compaction(facts: EtcdFacts) -> Finding:
    check = "etcd (compaction)"
    if facts.compacted:
        return Finding(
            level="ok", check=check, message=f"history compacted (revision {facts.revision})"
        )
    found = f"never compacted: every one of {facts.revision} revisions is kept"
    if facts.revision < _REVISIONS_WARN:
        return Finding(level="ok", check=check, message=found)
    return Finding(
        level="warn",
        check=check,
        message=found,
        advice="every renewal, claim and heartbeat is a new revision and etcd keeps them all "
        "until compacted, up to its quota (then NOSPACE refuses every write): run etcd with "
        "--auto-compaction-mode=periodic --auto-compaction-retention=1h (docs/ha.md)",
    )


def _keys(facts: EtcdFacts) -> Finding:
    check = "etcd (keys)"
    found = f"{facts.keys} key(s) under {facts.prefix!r}"
    if facts.keys > _KEYS_WARN:
        return Finding(
            level="warn",
            check=check,
            message=found,
            advice="etcd keeps every key in memory and fleetcron reads a ledger or a queue "
            "whole there: keep retention short (a job that sets none keeps a day and 10 runs "
            "on etcd) and queues small (docs/backends.md)",
        )
    return Finding(level="ok", check=check, message=found)


def _clock(facts: EtcdFacts) -> Finding:
    check = "etcd (clock)"
    low, high = facts.clock_low_s, facts.clock_high_s
    if low is None or high is None:
        return Finding(
            level="warn",
            check=check,
            message="cannot tell: the member's answers carried no Date header",
            advice="a proxy in front of etcd may strip it; the store's times then wait for one",
        )
    known = f"the member's clock is known to {(high - low) * 1e3:.0f} ms (its Date headers)"
    if low <= 0 < high:
        return Finding(
            level="ok",
            check=check,
            message=f"{known}; this host's clock lies within: the store's times are this host's",
        )
    off = low if low > 0 else high
    return Finding(
        level="warn",
        check=check,
        message=f"{known}; this host's clock is {abs(off):.3f} s "
        f"{'behind' if low > 0 else 'ahead of'} it at least: the store's times are the "
        "member's low bound",
        advice="keep this host's clock synchronised (NTP): replicas whose clocks lie outside "
        "the bounds write times up to the bounds' width apart (docs/backends.md)",
    )


def warn_at_open(url: str, status: Status) -> None:
    """Log what the member's status, read as the store opens, says will stop the fleet:
    a raised alarm (NOSPACE: every write refused) or a database near etcd's default
    quota. It costs no round trip of its own (``fleetcron doctor`` checks more)."""
    if status.errors:
        log.warning(
            "etcd at %s reports %s: while an alarm is raised etcd refuses every write (no "
            "lease granted, no run recorded); see fleetcron doctor",
            url,
            "; ".join(status.errors),
            extra={"action": "store_warning", "store": url},
        )
    if status.db_size >= _SIZE_WARN * DEFAULT_QUOTA:
        log.warning(
            "etcd at %s: its database is %s, %.0f%% of the default 2 GiB quota, past which "
            "every write is refused; compact and defragment it (docs/ha.md)",
            url,
            _mib(status.db_size),
            100 * status.db_size / DEFAULT_QUOTA,
            extra={"action": "store_warning", "store": url},
        )
