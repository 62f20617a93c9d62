"""The Redis store: leases and the run ledger as Lua scripts (``scripts.lua``), keys
hash-tagged so that each operation touches one Cluster slot."""

from __future__ import annotations

from fleetcron.stores.redis.keys import job_key, lease_key, run_key, slots_key
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.store import AsyncRedisStore, RedisStore

__all__ = [
    "AsyncRedisStore",
    "RedisOperations",
    "RedisStore",
    "job_key",
    "lease_key",
    "run_key",
    "slots_key",
]
