"""PostgreSQL replication as fleetcron judges it: the doctor's findings per replication
mode, the defaults of a multi-host URL, and a demoted server behind one."""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest

from fleetcron.errors import StoreRefused, StoreUnavailable
from fleetcron.stores.sql.postgres import translate
from fleetcron.stores.sql.replication import (
    ReplicationFacts,
    UnreplicatedCommits,
    multi_host,
    replication_facts,
    session_defaults,
)
from fleetcron.stores.url import parse_store_url


def facts(**given: object) -> ReplicationFacts:
    values: dict[str, object] = {
        "in_recovery": False,
        "synchronous_commit": "on",
        "synchronous_standby_names": "",
        "lc_messages": "C",
        "timeline": 1,
        "standbys": (),
        "multi_host": True,
    }
    values.update(given)
    return ReplicationFacts(**values)  # type: ignore[arg-type]


def test_one_server_without_standby_is_ok_and_says_what_a_loss_costs() -> None:
    [finding] = facts().findings()
    assert finding.level == "ok"
    assert "one server" in finding.message


def test_asynchronous_standbys_warn_that_a_failover_can_lose_acknowledged_writes() -> None:
    [finding] = facts(standbys=(("s2", "streaming", "async"),)).findings()
    assert finding.level == "warn"
    assert "asynchronous" in finding.message
    assert "s2" in finding.message
    assert "can lose writes" in finding.advice
    assert "run again" in finding.advice
    assert "timeline" in finding.advice


@pytest.mark.parametrize("commit", ["off", "local"])
def test_synchronous_names_with_commits_that_do_not_wait_are_asynchronous(commit: str) -> None:
    [finding] = facts(
        synchronous_commit=commit,
        synchronous_standby_names="FIRST 1 (s2)",
        standbys=(("s2", "streaming", "sync"),),
    ).findings()
    assert finding.level == "warn"
    assert finding.message.startswith("asynchronous")


def test_a_connected_synchronous_standby_is_ok() -> None:
    [finding] = facts(
        synchronous_standby_names="FIRST 1 (s2)", standbys=(("s2", "streaming", "sync"),)
    ).findings()
    assert finding.level == "ok"
    assert finding.message.startswith("synchronous")
    assert "keeps every write" in finding.advice
    assert "names one host" not in finding.advice


def test_a_synchronous_deployment_behind_a_one_host_url_is_told_to_name_both() -> None:
    [finding] = facts(
        synchronous_standby_names="FIRST 1 (s2)",
        standbys=(("s2", "streaming", "sync"),),
        multi_host=False,
    ).findings()
    assert finding.level == "ok"
    assert "names one host" in finding.advice


def test_synchronous_without_a_synchronous_standby_warns_that_every_write_waits() -> None:
    for standbys in [(), (("s2", "catchup", "potential"),)]:
        [finding] = facts(synchronous_standby_names="FIRST 1 (s2)", standbys=standbys).findings()
        assert finding.level == "warn"
        assert "every write waits" in finding.message


def test_standbys_the_role_may_not_see_the_state_of_are_not_taken_for_missing() -> None:
    [finding] = facts(
        synchronous_standby_names="FIRST 1 (s2)", standbys=(("s2", None, None),)
    ).findings()
    assert finding.level == "ok"


def test_a_standby_server_fails_the_check() -> None:
    [finding] = facts(in_recovery=True, timeline=None).findings()
    assert finding.level == "fail"
    assert "standby" in finding.message


def test_messages_not_in_english_under_synchronous_replication_warn() -> None:
    findings = facts(
        synchronous_standby_names="FIRST 1 (s2)",
        standbys=(("s2", "streaming", "sync"),),
        lc_messages="de_DE.UTF-8",
    ).findings()
    assert [finding.level for finding in findings] == ["ok", "warn"]
    assert "lc_messages" in findings[1].message
    for english in ("C", "en_US.UTF-8", "POSIX", "C.UTF-8", ""):
        assert len(facts(synchronous_standby_names="x", lc_messages=english).findings()) == 1


def test_replication_facts_are_read_from_the_doctor_row() -> None:
    read = replication_facts(
        (False, "on", "FIRST 1 (s2)", "C", 3, '[["s2", "streaming", "sync"]]'), multi=False
    )
    assert read.timeline == 3
    assert read.standbys == (("s2", "streaming", "sync"),)
    assert not read.multi_host


def test_multi_host_urls_get_the_writable_server_unless_they_say() -> None:
    one = parse_store_url("postgresql://app@db1:5432/app")
    listed = parse_store_url("postgresql://app@db1:5432,db2:5433/app")
    in_query = parse_store_url("postgresql:///app?host=db1,db2&port=5432,5433")
    chosen = parse_store_url("postgresql://app@db1,db2/app?target_session_attrs=any")
    assert not multi_host(one)
    assert session_defaults(one) == {}
    assert multi_host(listed)
    assert session_defaults(listed) == {"target_session_attrs": "read-write"}
    assert multi_host(in_query)
    assert session_defaults(in_query) == {"target_session_attrs": "read-write"}
    assert multi_host(chosen)
    assert session_defaults(chosen) == {}


def test_a_read_only_server_is_unavailable_behind_several_hosts_and_refused_behind_one() -> None:
    error = psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only txn")
    assert isinstance(translate(error, multi_host=True), StoreUnavailable)
    assert isinstance(translate(error, multi_host=False), StoreRefused)


def _notice(severity: str, message: str) -> SimpleNamespace:
    return SimpleNamespace(severity_nonlocalized=severity, message_primary=message)


def test_only_a_cancelled_wait_for_a_synchronous_standby_fails_the_statement() -> None:
    url = parse_store_url("postgresql://app@db1/app")
    commits = UnreplicatedCommits()
    commits.notice(_notice("NOTICE", "relation already exists, skipping"))
    commits.notice(_notice("WARNING", "there is no transaction in progress"))
    commits.check(url)  # nothing seen: no error
    for message in (
        "canceling wait for synchronous replication due to user request",
        "canceling the wait for synchronous replication and terminating connection due to "
        "administrator command",
    ):
        commits.notice(_notice("WARNING", message))
        with pytest.raises(StoreUnavailable, match="without its synchronous standby"):
            commits.check(url)
        commits.check(url)  # said once
    commits.notice(_notice("WARNING", "canceling wait for synchronous replication"))
    commits.forget()  # a statement before this one's
    commits.check(url)
