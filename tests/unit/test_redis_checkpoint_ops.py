"""The Redis checkpoint operations driven without Redis: statements out, canned replies in.

What is checked is each operation's own logic: one script call (one round trip) on the
checkpoint's one key, with which arguments, how the reply maps back to a record, and that
the key stays out of every SCAN of leases, the ledger and the queue. The scripts
themselves run against a real Redis in ``tests/contract/test_checkpoints.py``.
"""

from __future__ import annotations

import re

import pytest
from redis.crc import key_slot

from fleetcron.queue_models import CheckpointRecord
from fleetcron.stores.base import CheckpointOperations, drive
from fleetcron.stores.redis.checkpoints import CHECKPOINT_PREFIX, checkpoint_key
from fleetcron.stores.redis.keys import (
    is_lease_key,
    jobs_pattern,
    lease_key,
    namespace_pattern,
    slots_pattern,
)
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.queue import _queues_pattern
from fleetcron.stores.redis.scripts import SCRIPT_BLOCKS, SCRIPTS
from fleetcron.stores.redis.statements import KeyScan, Script, fan_out
from unit.fakes import FakeExecute

REDIS = RedisOperations()
NS = "ns"
KEY = checkpoint_key(NS, "sync")

# Namespaces and names that look like other keys' parts, or like glob and hash-tag syntax.
TRICKY = [
    ("ns", "sync"),
    ("a*b", "x}:job"),
    ("a:b", "c}:slots"),
    ("name space", "q}:ids"),
    ("☃", "fleetcron:job:x"),
    ("ns", "fleetcron:queue:q"),
    ("n[s]?", "}"),
    ("ns", ""),
]


def glob_matches(pattern: str, key: str) -> bool:
    """Whether a Redis SCAN ``MATCH`` pattern matches ``key``: ``\\x`` is a literal x, ``*``
    any text, ``?`` one character (the patterns here use no ``[...]`` class)."""
    regex = "".join(
        ".*" if part == "*" else "." if part == "?" else re.escape(part[-1])
        for part in re.findall(r"\\.|\*|\?|.", pattern, re.S)
    )
    return re.fullmatch(regex, key, re.S) is not None


# -- the key ----------------------------------------------------------------------------
def test_key_layout_is_the_documented_one() -> None:
    assert KEY == "fleetcron:{2:ns:fleetcron:checkpoint:sync}:checkpoint"
    assert CHECKPOINT_PREFIX == "fleetcron:checkpoint:"


@pytest.mark.parametrize(("namespace", "name"), TRICKY)
def test_the_key_is_under_its_own_hash_tag_and_never_looks_like_a_lease(
    namespace: str, name: str
) -> None:
    key = checkpoint_key(namespace, name)
    tag = lease_key(namespace, CHECKPOINT_PREFIX + name)

    assert key.startswith(tag)
    assert key_slot(key.encode()) == key_slot(tag.encode())
    assert not key.endswith("}")
    assert not is_lease_key(key)


@pytest.mark.parametrize(("namespace", "name"), TRICKY)
def test_no_lease_ledger_or_queue_scan_pattern_matches_the_key(namespace: str, name: str) -> None:
    key = checkpoint_key(namespace, name)
    for pattern in (jobs_pattern, slots_pattern, _queues_pattern):
        assert not glob_matches(pattern(namespace), key), pattern.__name__
    # The namespace SCAN of lease_list/lease_prune does find it; is_lease_key drops it.
    assert glob_matches(namespace_pattern(namespace), key)


def test_the_glob_helper_matches_what_the_patterns_are_meant_to_match() -> None:
    # Guards the negative checks above: a helper matching nothing would pass them all.
    assert glob_matches(jobs_pattern("a*b"), lease_key("a*b", "fleetcron:job:x") + ":job")
    assert glob_matches(slots_pattern("n[s]?"), lease_key("n[s]?", "fleetcron:job:x") + ":slots")
    assert glob_matches(_queues_pattern("☃"), lease_key("☃", "fleetcron:queue:q") + ":ids")
    assert not glob_matches(jobs_pattern("a*b"), lease_key("a-b", "fleetcron:job:x") + ":job")


def test_the_keys_of_distinct_checkpoints_are_distinct() -> None:
    keys = {checkpoint_key(namespace, name) for namespace, name in TRICKY}
    keys |= {checkpoint_key("a", "b:c"), checkpoint_key("a:b", "c")}

    assert len(keys) == len(TRICKY) + 2


def test_lease_listing_and_pruning_skip_checkpoint_keys() -> None:
    lease = lease_key(NS, "sync")  # a lease of the same name: a different key
    keys = [KEY, lease, checkpoint_key(NS, "x}")]
    execute = FakeExecute(keys, [None], keys, [False])

    drive(REDIS.lease_list(NS), execute)
    drive(REDIS.lease_prune(NS, 1, True), execute)

    assert execute.statements == [
        KeyScan(namespace_pattern(NS)),
        fan_out("lease_get", (lease,)),
        KeyScan(namespace_pattern(NS)),
        fan_out("lease_prune", (lease,), (1, 1)),
    ]


# -- the operations ------------------------------------------------------------------------
def test_redis_operations_implement_the_checkpoint_protocol() -> None:
    assert isinstance(REDIS, CheckpointOperations)


def test_get_is_one_script_call_mapping_the_reply_to_a_record() -> None:
    value = '{"last_id":4211,"note":"naïve \'q\' \\"dq\\" 🎉"}'
    execute = FakeExecute(
        [value.encode(), 1_700_000_000_000_010, 1_700_000_000_000_020, 1_700_000_000_000_030]
    )

    got = drive(REDIS.checkpoint_get(NS, "sync"), execute)

    assert got == CheckpointRecord(
        namespace=NS,
        name="sync",
        value=value,
        fence=1_700_000_000_000_010,
        updated_us=1_700_000_000_000_020,
        now_us=1_700_000_000_000_030,
    )
    assert execute.statements == [Script("checkpoint_get", (KEY,), ())]


@pytest.mark.parametrize("reply", [None, False])
def test_get_of_a_checkpoint_never_set_is_none(reply: object) -> None:
    execute = FakeExecute(reply)

    assert drive(REDIS.checkpoint_get(NS, "sync"), execute) is None
    assert execute.statements == [Script("checkpoint_get", (KEY,), ())]


def test_an_empty_value_is_a_value() -> None:
    got = drive(REDIS.checkpoint_get(NS, "sync"), FakeExecute([b"", 1, 2, 3]))

    assert got is not None
    assert got.value == ""


@pytest.mark.parametrize(("reply", "moved"), [(1, True), (0, False)])
def test_set_is_one_script_call_with_fence_and_value(reply: int, moved: bool) -> None:
    execute = FakeExecute(reply)

    assert drive(REDIS.checkpoint_set(NS, "sync", 12, '{"a":"é"}'), execute) is moved
    assert execute.statements == [Script("checkpoint_set", (KEY,), (12, '{"a":"é"}'))]


# -- the scripts -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["checkpoint_get", "checkpoint_set"])
def test_each_script_reads_the_servers_clock_and_touches_only_its_key(name: str) -> None:
    assert SCRIPT_BLOCKS[name].uses == ("now",)
    assert "redis.call('TIME')" in SCRIPTS[name]
    # One key per operation: one hash slot, and no key a Cluster could not route.
    calls = re.findall(r"redis\.call\('[A-Z]+', ([^,)]+)", SCRIPT_BLOCKS[name].text)
    assert calls
    assert set(calls) == {"KEYS[1]"}
