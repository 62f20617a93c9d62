"""Lock mode ``advisory``: the key of a name and the mark of an advisory holder, which
every process and version must compute alike."""

from __future__ import annotations

import pytest

from fleetcron.errors import ConfigurationError
from fleetcron.lease import new_holder
from fleetcron.lock_terms import lease_terms
from fleetcron.models import LeaseRecord, display_holder, is_advisory_holder
from fleetcron.stores.sql.advisory import advisory_key, mark_advisory, session_name


def test_a_names_key_is_fixed_and_depends_on_its_namespace() -> None:
    # Pinned: two versions of fleetcron computing different keys would both hold a name.
    assert advisory_key("default", "report") == -4360497590672592805
    assert advisory_key("prod", "report") == 8020572398269625525
    assert advisory_key("a", "b:c") != advisory_key("a:b", "c")
    for namespace, name in [("default", ""), ("ns", "x" * 500), ("ü", "名前")]:
        assert -(2**63) <= advisory_key(namespace, name) < 2**63


def test_an_advisory_holder_is_marked_in_its_secret_token_only() -> None:
    holder = new_holder()
    marked = mark_advisory(holder)
    assert not is_advisory_holder(holder)
    assert is_advisory_holder(marked)
    assert display_holder(marked) == display_holder(holder)  # host:pid, token hidden
    record = LeaseRecord(
        namespace="n",
        name="x",
        holder=marked,
        fence=1,
        acquired_us=0,
        expires_us=1,
        min_until_us=0,
        now_us=0,
    )
    assert record.mode == "advisory"


def test_the_sessions_application_name_fits_what_postgresql_keeps() -> None:
    assert session_name("prod", "report") == "fleetcron advisory prod/report"
    long = session_name("prod", "é" * 100)
    assert len(long.encode()) <= 63
    assert long.startswith("fleetcron advisory prod/é")


def test_an_unknown_lock_mode_is_refused_before_any_store_is_touched() -> None:
    with pytest.raises(ConfigurationError, match="lock mode must be one of 'lease', 'advisory'"):
        lease_terms("n", "x", lock_at_most="1m", lock_at_least=0, keepalive=True, mode="flock")
    assert lease_terms("n", "x", lock_at_most="1m", lock_at_least=0, keepalive=True).mode == "lease"
