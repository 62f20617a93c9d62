"""Checkpoints of the Redis store (:class:`~fleetcron.stores.base.CheckpointOperations`):
each operation is one Lua script call (the scripts are ``checkpoints.lua``), so one round
trip and one atomic step, with ``updated_us`` and ``now_us`` from the server's ``TIME``
read inside the script.

A checkpoint is one hash, under the hash tag of the name ``fleetcron:checkpoint:<name>``
built as a lease's is (:func:`~fleetcron.stores.redis.keys.lease_key`), plus the suffix
``:checkpoint``. With ``C = fleetcron:{<len(ns)>:<ns>:fleetcron:checkpoint:<name>}``:

- ``C:checkpoint`` — ``value`` (the text as set, byte for byte), ``fence`` (that of the
  run which set it last) and ``updated`` (µs). It has no TTL: like a lease row, a
  checkpoint stays until deleted by hand.

The key ends with ``}:checkpoint``, never with ``}``, so the lease SCAN does not take it for
a lease; nor with ``}:job``, ``}:slots`` or ``}:ids``, so the ledger and queue SCANs never
match it. The fixed prefix and suffix around ``<name>`` make the key of each (namespace,
name) distinct, whatever the name holds (even ``}``).
"""

from __future__ import annotations

from fleetcron.queue_models import CheckpointRecord
from fleetcron.stores.base import Operation
from fleetcron.stores.redis.keys import lease_key
from fleetcron.stores.redis.replies import checkpoint_of
from fleetcron.stores.redis.statements import Script

__all__ = ["CHECKPOINT_PREFIX", "RedisCheckpoints", "checkpoint_key"]

CHECKPOINT_PREFIX = "fleetcron:checkpoint:"
"""A checkpoint's key is under the hash tag of this prefix and the checkpoint's name."""

_SUFFIX = ":checkpoint"


def checkpoint_key(namespace: str, name: str) -> str:
    """The hash of checkpoint ``name``: its own hash tag, then a suffix so that it never
    ends with ``}`` as a lease key does."""
    return lease_key(namespace, CHECKPOINT_PREFIX + name) + _SUFFIX


class RedisCheckpoints:
    """Checkpoint operations as script calls, one script on one key each."""

    def checkpoint_get(self, namespace: str, name: str) -> Operation[CheckpointRecord | None]:
        reply = yield Script("checkpoint_get", (checkpoint_key(namespace, name),), ())
        return checkpoint_of(namespace, name, reply)

    def checkpoint_set(self, namespace: str, name: str, fence: int, value: str) -> Operation[bool]:
        reply = yield Script("checkpoint_set", (checkpoint_key(namespace, name),), (fence, value))
        return bool(reply)
