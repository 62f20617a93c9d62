"""What ``fleetcron doctor`` checks of a Redis server: persistence, eviction and
replication, from the settings the store reads (:meth:`RedisStore.doctor_facts
<fleetcron.stores.redis.store.RedisStore.doctor_facts>`)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetcron.doctor.findings import Finding

__all__ = ["RedisFacts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisFacts:
    """A Redis server's role and settings. A setting is ``None`` when ``CONFIG GET`` was
    refused (renamed or disabled, as on managed Redis; ``config_error`` says how)."""

    role: str
    replicas: int
    appendonly: str | None
    appendfsync: str | None
    save: str | None
    maxmemory_policy: str | None
    config_error: str | None = None

    def findings(self) -> list[Finding]:
        """Persistence, eviction and replication, each a finding."""
        return [_persistence(self), _eviction(self), _replication(self)]


def _cannot_tell(redis: RedisFacts, check: str, setting: str) -> Finding:
    return Finding(
        level="warn",
        check=check,
        message=f"cannot tell: CONFIG GET {setting} was refused "
        f"({redis.config_error or 'no value'})",
        advice="CONFIG is disabled or not granted (managed Redis): check the setting in "
        "the provider's console (docs/backends.md lists what each one keeps)",
    )


def _persistence(redis: RedisFacts) -> Finding:
    check = "redis (persistence)"
    aof, fsync, save = redis.appendonly, redis.appendfsync, redis.save
    if aof is None or save is None:
        return _cannot_tell(redis, check, "appendonly/save")
    lost = (
        "a restart loses the leases and the run ledger since then: slots that already ran "
        "can run again (fences stay monotonic)"
    )
    if aof == "yes":
        if fsync in ("always", "everysec"):
            kept = "everything" if fsync == "always" else "all but the last second before a crash"
            found = f"appendonly yes, appendfsync {fsync}: keeps {kept}"
            return Finding(level="ok", check=check, message=found)
        return Finding(
            level="warn",
            check=check,
            message=f"appendonly yes, appendfsync {fsync}: the OS decides when writes reach "
            "the disk (about every 30s)",
            advice=f"{lost}; set appendfsync everysec or always",
        )
    if save.strip():
        return Finding(
            level="warn",
            check=check,
            message=f'RDB snapshots only (appendonly no, save "{save}")',
            advice=f"{lost}; set appendonly yes",
        )
    return Finding(
        level="warn",
        check=check,
        message='keeps nothing across a restart (appendonly no, save "")',
        advice=f"{lost}; set appendonly yes (docs/backends.md)",
    )


def _eviction(redis: RedisFacts) -> Finding:
    check = "redis (eviction)"
    policy = redis.maxmemory_policy
    if policy is None:
        return _cannot_tell(redis, check, "maxmemory-policy")
    if policy.startswith("allkeys-"):
        return Finding(
            level="warn",
            check=check,
            message=f"maxmemory-policy {policy}: lease hashes can be evicted under memory pressure",
            advice="a lease evicted early lets a second replica take a running job's slot "
            "(fences stay monotonic); use noeviction or a volatile-* policy, which leave "
            "fleetcron's keys (no TTL) alone",
        )
    return Finding(level="ok", check=check, message=f"maxmemory-policy {policy}")


def _replication(redis: RedisFacts) -> Finding:
    check = "redis (replication)"
    if redis.role not in ("master", "primary"):
        return Finding(
            level="fail",
            check=check,
            message=f"the server is a {redis.role}, not a primary",
            advice="fleetcron refuses a replica: point the backend URL at the primary",
        )
    if redis.replicas:
        return Finding(
            level="warn",
            check=check,
            message=f"primary with {redis.replicas} connected replica(s): replication is "
            "asynchronous",
            advice="a failover to a replica loses the writes it had not received: a lease "
            "taken just before can be taken again, and a slot that just ran can run again. "
            "Fences still increase (they fold in the server's clock): data that checks "
            "ctx.fence / $FLEETCRON_FENCE refuses the stale holder",
        )
    return Finding(level="ok", check=check, message="primary, no replicas")
