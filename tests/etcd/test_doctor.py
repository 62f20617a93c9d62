"""``fleetcron doctor`` on etcd: the facts the store reads of a real cluster, and how they
are judged."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from etcd_server import EtcdCluster
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.etcd.doctor import DEFAULT_QUOTA, EtcdFacts, warn_at_open
from fleetcron.stores.etcd.messages import ResponseHeader, Status
from fleetcron.stores.etcd.store import EtcdStore


def _facts(**changes: object) -> EtcdFacts:
    base = EtcdFacts(
        endpoint="http://10.0.0.1:2379",
        version="3.5.9",
        members=("m0", "m1", "m2"),
        leader=7,
        db_size=20 * 1024**2,
        db_size_in_use=12 * 1024**2,
        alarms=(),
        prefix="app",
        keys=1200,
        revision=5_000_000,
        compacted=True,
        round_trip_s=0.0012,
        clock_low_s=-0.012,
        clock_high_s=0.006,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _levels(facts: EtcdFacts) -> dict[str, str]:
    return {finding.check: finding.level for finding in facts.findings()}


def test_a_store_reads_members_leader_size_and_its_keys_from_a_real_cluster() -> None:
    with EtcdCluster(3) as cluster:
        store = open_store(parse_store_url(cluster.url + "/doctor"))
        try:
            assert isinstance(store, EtcdStore)
            store.run(store.ops.lease_acquire("ns", "a", "me", 5_000_000, 0))
            store.run(store.ops.lease_acquire("ns", "b", "me", 5_000_000, 0))
            (facts,) = store.doctor_facts()
            status, _ = cluster.post(0, "/v3/kv/compaction", {"revision": str(facts.revision)})
            assert status == 200
            (after,) = store.doctor_facts()
        finally:
            store.close()

    assert sorted(facts.members) == ["m0", "m1", "m2"]
    assert facts.leader != 0
    assert facts.version.startswith("3.")
    assert facts.db_size > 0
    assert facts.alarms == ()
    assert facts.prefix == "doctor"
    assert facts.keys >= 2  # each held lease's key at least
    assert not facts.compacted  # a new cluster
    assert after.compacted
    assert all(finding.level == "ok" for finding in facts.findings())


def test_a_cluster_without_a_leader_fails_and_one_of_fewer_than_three_members_warns() -> None:
    assert _levels(_facts(leader=0))["etcd (members)"] == "fail"
    assert _levels(_facts(members=("m0",)))["etcd (members)"] == "warn"
    assert _levels(_facts())["etcd (members)"] == "ok"


def test_a_raised_alarm_fails_and_says_how_to_clear_it() -> None:
    facts = _facts(alarms=("NOSPACE (member 8e9e05c52164694d)",))
    (alarm,) = [f for f in facts.findings() if f.check == "etcd (alarms)"]

    assert alarm.level == "fail"
    assert "NOSPACE" in alarm.message
    assert "alarm disarm" in alarm.advice


def test_a_database_near_the_default_quota_warns() -> None:
    assert _levels(_facts(db_size=int(DEFAULT_QUOTA * 0.7)))["etcd (database size)"] == "warn"
    assert _levels(_facts(db_size=int(DEFAULT_QUOTA * 0.5)))["etcd (database size)"] == "ok"


def test_many_keys_under_the_prefix_warn_to_keep_retention_short() -> None:
    (keys,) = [f for f in _facts(keys=500_000).findings() if f.check == "etcd (keys)"]

    assert keys.level == "warn"
    assert "retention" in keys.advice


def test_a_host_clock_outside_the_members_bounds_warns() -> None:
    assert _levels(_facts())["etcd (clock)"] == "ok"
    (ahead,) = [
        f
        for f in _facts(clock_low_s=-2.5, clock_high_s=-2.49).findings()
        if f.check == "etcd (clock)"
    ]
    assert ahead.level == "warn"
    assert "2.490 s ahead of it" in ahead.message
    assert _levels(_facts(clock_low_s=0.3, clock_high_s=0.32))["etcd (clock)"] == "warn"


def test_a_history_never_compacted_warns_once_it_is_long() -> None:
    (long,) = [
        f
        for f in _facts(compacted=False, revision=250_000).findings()
        if f.check == "etcd (compaction)"
    ]
    assert long.level == "warn"
    assert "--auto-compaction-retention" in long.advice
    assert _levels(_facts(compacted=False, revision=900))["etcd (compaction)"] == "ok"
    assert _levels(_facts(compacted=True))["etcd (compaction)"] == "ok"


def test_a_raised_alarm_or_a_full_database_is_logged_when_the_store_opens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    header = ResponseHeader(member_id=1, revision=10)
    with caplog.at_level(logging.WARNING, logger="fleetcron"):
        warn_at_open("etcd://e1", Status(header=header, db_size=1024))
        assert not caplog.records, "a healthy member: nothing to say"
        warn_at_open("etcd://e1", Status(header=header, errors=("memberID:1 alarm:NOSPACE",)))
        warn_at_open("etcd://e1", Status(header=header, db_size=int(DEFAULT_QUOTA * 0.9)))

    alarm, size = (record.getMessage() for record in caplog.records)
    assert "alarm:NOSPACE" in alarm
    assert "refuses every write" in alarm
    assert "90% of the default 2 GiB quota" in size
