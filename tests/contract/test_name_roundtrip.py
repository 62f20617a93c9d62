"""Names reach the store only as bound values: any valid name round-trips exactly."""

from __future__ import annotations

import uuid

import pytest

from contract.contract_support import must_acquire, row
from fleetcron import ConfigurationError, Fleet
from fleetcron.names import MAX_NAME_LENGTH, MAX_NAMESPACE_LENGTH
from fleetcron.stores import SyncStore

AWKWARD_NAMES = [
    "it's",
    'say "hi"',
    "a;b",
    "x -- y",
    "'; DROP TABLE fleetcron_lease; --",
    "%s %(name)s :name ? $1 @fc_now",
    "glob*?[ab]\\",
    "{hash}:tag}",
    "naïve ☃ 名前",
    "🔒 emoji",
    "Case",
    "case",
    "a" * MAX_NAME_LENGTH,
    "名" * MAX_NAME_LENGTH,
    "🔒" * MAX_NAME_LENGTH,  # 4 bytes each in UTF-8: the widest name a store must hold
]


def test_awkward_and_maximum_length_names_round_trip_through_acquire_get_and_list(
    fleet: Fleet,
) -> None:
    leases = {}
    for name in AWKWARD_NAMES:
        lease = fleet.try_lock(name, keepalive=False)
        assert lease is not None, f"{name!r} should be free"
        assert lease.record.name == name
        leases[name] = lease

    for name, lease in leases.items():
        record = fleet.get(name)
        assert record is not None, name
        assert (record.name, record.holder, record.fence) == (name, lease.holder, lease.fence)
        assert record.held
        assert fleet.try_lock(name, keepalive=False) is None, f"{name!r} is held"

    listed = fleet.locks()
    assert [record.name for record in listed] == sorted(AWKWARD_NAMES)
    assert {r.name: r.fence for r in listed} == {n: lease.fence for n, lease in leases.items()}
    for lease in leases.values():
        assert lease.release()


def test_a_maximum_length_namespace_of_wide_characters_round_trips(store: SyncStore) -> None:
    namespace = "🔒" * (MAX_NAMESPACE_LENGTH - 12) + uuid.uuid4().hex[:12]
    assert len(namespace) == MAX_NAMESPACE_LENGTH

    record = must_acquire(store, namespace, "job", "holder-1")

    assert record.namespace == namespace
    assert row(store, namespace, "job").holder == "holder-1"
    assert [r.name for r in store.run(store.ops.lease_list(namespace))] == ["job"]


def test_a_namespace_with_glob_characters_lists_only_its_own_rows(
    store: SyncStore, namespace: str
) -> None:
    pattern_like, lookalike = f"{namespace}-*", f"{namespace}-x"
    must_acquire(store, pattern_like, "mine", "holder-1")
    must_acquire(store, lookalike, "theirs", "holder-2")

    assert [r.name for r in store.run(store.ops.lease_list(pattern_like))] == ["mine"]
    assert [r.name for r in store.run(store.ops.lease_list(lookalike))] == ["theirs"]


def test_two_unicode_spellings_of_one_name_are_one_lock(fleet: Fleet) -> None:
    lease = fleet.try_lock("cafe\u0301", keepalive=False)

    assert lease is not None
    assert lease.name == "caf\u00e9"
    assert fleet.try_lock("caf\u00e9", keepalive=False) is None
    record = fleet.get("cafe\u0301")
    assert record is not None
    assert record.name == "caf\u00e9"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("a" * (MAX_NAME_LENGTH + 1), "maximum"),
        ("🔒" * (MAX_NAME_LENGTH + 1), "maximum"),
    ],
)
def test_an_empty_or_over_long_name_is_a_configuration_error_that_changes_nothing(
    fleet: Fleet, name: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        fleet.try_lock(name)
    with pytest.raises(ConfigurationError, match=problem):
        fleet.lock(name)
    with pytest.raises(ConfigurationError, match=problem):
        fleet.locked(name)
    with pytest.raises(ConfigurationError, match=problem):
        fleet.get(name)

    assert fleet.locks() == []
