"""Checkpoints (high-water marks) of every backend: fenced, so a stale run cannot move them."""

from __future__ import annotations

import json

import pytest

from fleetcron.stores import SyncStore
from fleetcron.stores.base import CheckpointOperations


@pytest.fixture
def ops(store: SyncStore) -> CheckpointOperations:
    assert isinstance(store.ops, CheckpointOperations), "the backend has no checkpoints"
    return store.ops


def test_a_checkpoint_is_unset_until_set_then_holds_its_value_fence_and_time(
    store: SyncStore, ops: CheckpointOperations, namespace: str
) -> None:
    assert store.run(ops.checkpoint_get(namespace, "sync")) is None
    value = json.dumps({"last_id": 4211, "note": "naïve 'q' \"dq\" 🎉"})
    before = store.run(store.ops.store_now())

    assert store.run(ops.checkpoint_set(namespace, "sync", 10, value)) is True

    got = store.run(ops.checkpoint_get(namespace, "sync"))
    assert got is not None
    assert (got.namespace, got.name, got.value, got.fence) == (namespace, "sync", value, 10)
    assert before <= got.updated_us <= got.now_us
    assert store.run(ops.checkpoint_get(namespace + "-2", "sync")) is None
    assert store.run(ops.checkpoint_get(namespace, "other")) is None


def test_the_same_or_a_higher_fence_moves_it_and_a_lower_one_is_refused(
    store: SyncStore, ops: CheckpointOperations, namespace: str
) -> None:
    assert store.run(ops.checkpoint_set(namespace, "cp", 10, "1"))
    assert store.run(ops.checkpoint_set(namespace, "cp", 10, "2")), "the same run again"
    assert store.run(ops.checkpoint_set(namespace, "cp", 12, "3"))

    assert store.run(ops.checkpoint_set(namespace, "cp", 11, "stale")) is False

    got = store.run(ops.checkpoint_get(namespace, "cp"))
    assert got is not None
    assert (got.value, got.fence) == ("3", 12)
