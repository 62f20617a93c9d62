"""Lock mode ``advisory`` (PostgreSQL): a session advisory lock on the holder's own
connection beside the lease row. The server frees it the moment the holder's session
ends, so a contender takes the name over at once with a higher fence — not
``lock_at_most`` later — and the dead holder's renewals and fenced writes are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from contract.contract_support import eventually, wait_until_freed
from fleetcron import (
    AsyncFleet,
    ConfigurationError,
    Fleet,
    Lease,
    LeaseLost,
    StoreUnavailable,
    fencing,
)
from fleetcron.advisory_lease import AdvisoryLease, SyncAdvisoryLease
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.advisory import AdvisorySession, advisory_key
from fleetcron.stores.url import StoreURL
from pgbouncer_server import PgBouncer
from services import require_service, url_of

TEN_MINUTES_US = 600_000_000


@pytest.fixture
def pg_url() -> str:
    return require_service("postgres")


@pytest.fixture
def fleets(pg_url: str, namespace: str) -> Iterator[tuple[Fleet, Fleet]]:
    """Two fleets of one namespace: two replicas, each with its own store connection."""
    with Fleet(pg_url, namespace=namespace) as first, Fleet(pg_url, namespace=namespace) as second:
        yield first, second


def _terminate(url: str, pid: int) -> None:
    """End a server session as an operator (or a dying host) would."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _sessions_holding(url: str, namespace: str, name: str) -> int:
    key = advisory_key(namespace, name)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND granted AND ((classid::bigint << 32) | objid::bigint) = %s",
            (key,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_advisory_holder_excludes_advisory_and_plain_contenders_until_it_releases(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    first, second = fleets
    held = first.try_lock("report", mode="advisory")
    assert isinstance(held, SyncAdvisoryLease)
    assert second.try_lock("report", mode="advisory") is None
    assert second.try_lock("report") is None  # a plain contender respects the live row
    assert _sessions_holding(pg_url, namespace, "report") == 1  # the refused one let go
    record = first.get("report")
    assert record is not None
    assert record.mode == "advisory"
    assert record.fence == held.fence

    assert held.release()
    assert _sessions_holding(pg_url, namespace, "report") == 0
    after = second.try_lock("report", mode="advisory")
    assert after is not None
    assert after.fence > held.fence
    after.release()


def test_a_holder_whose_session_ends_is_taken_over_at_once_with_a_higher_fence(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    first, second = fleets
    old = first.try_lock("sweep", mode="advisory", lock_at_most="10m")
    assert isinstance(old, SyncAdvisoryLease)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        fencing.create_tables(conn)
        with conn.transaction():
            fencing.check(conn, namespace, old.fence)  # the old holder wrote once

    _terminate(pg_url, old.session.pid)
    assert old.lost.wait(10), "the end of the session was not noticed"
    # A plain contender still waits for the row's expiry, ten minutes away.
    assert second.try_lock("sweep") is None
    new = second.try_lock("sweep", mode="advisory", wait="10s")

    assert new is not None
    assert new.fence > old.fence
    assert new.record.acquired_us < old.record.expires_us - TEN_MINUTES_US // 2
    # The old holder's renewal (as its keepalive sends it) and its fenced write are refused.
    store = open_store(parse_store_url(pg_url))
    try:
        assert (
            store.run(
                store.ops.lease_extend(namespace, "sweep", old.holder, old.fence, TEN_MINUTES_US)
            )
            is None
        )
    finally:
        store.close()
    with pytest.raises(LeaseLost):
        old.extend()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with conn.transaction():
            fencing.check(conn, namespace, new.fence)
        with pytest.raises(fencing.StaleFence), conn.transaction():
            fencing.check(conn, namespace, old.fence)
    old.release()
    assert new.valid
    new.release()


def test_a_holder_whose_session_ends_before_it_writes_its_row_never_takes_the_row_over(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The advisory lock is taken, then the session dies, and another holder takes the lock
    # and writes its row — all before the first one writes its own row.
    first, second = fleets
    real_open = AdvisorySession.open
    taken: list[Lease | Fleet] = []

    def open_then_lose(url: StoreURL, ns: str, name: str) -> AdvisorySession | None:
        session = real_open(url, ns, name)
        if taken:  # the other holder's own acquisition
            return session
        assert session is not None
        _terminate(pg_url, session.pid)
        taken.append(first)  # a placeholder until the other holder has it
        lease = second.try_lock(name, mode="advisory", wait="10s")
        assert lease is not None
        taken[:] = [lease]
        return session

    monkeypatch.setattr(AdvisorySession, "open", staticmethod(open_then_lose))
    with pytest.raises(StoreUnavailable):
        first.try_lock("raced", mode="advisory")
    monkeypatch.undo()
    (winner,) = taken
    assert isinstance(winner, Lease)
    record = first.get("raced")
    assert record is not None
    assert (record.holder, record.fence) == (winner.holder, winner.fence)
    assert winner.valid
    winner.extend()  # its renewal is not refused: nobody took its row
    winner.release()


def test_the_work_of_a_holder_whose_session_ends_is_interrupted(
    fleets: tuple[Fleet, Fleet], pg_url: str
) -> None:
    first, _ = fleets
    with pytest.raises(LeaseLost, match="advisory lock ended"):
        with first.lock("cleanup", mode="advisory", keepalive=False) as lease:
            assert isinstance(lease, SyncAdvisoryLease)
            _terminate(pg_url, lease.session.pid)
            lease.lost.wait(10)
            lease.check()


def test_an_advisory_contender_respects_a_plain_lease_until_it_expires(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    first, second = fleets
    plain = first.try_lock("mixed", lock_at_most="1s", keepalive=False)
    assert plain is not None
    assert second.try_lock("mixed", mode="advisory") is None
    assert _sessions_holding(pg_url, namespace, "mixed") == 0  # the refused session let go

    store = open_store(parse_store_url(pg_url))
    try:
        wait_until_freed(store, namespace, "mixed", plain.record.expires_us)
    finally:
        store.close()
    advisory = second.try_lock("mixed", mode="advisory")
    assert advisory is not None
    assert advisory.fence > plain.fence
    advisory.release()


def test_a_takeover_keeps_the_dead_holders_lock_at_least(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    first, second = fleets
    old = first.try_lock("least", mode="advisory", lock_at_most="10m", lock_at_least="1s")
    assert isinstance(old, SyncAdvisoryLease)
    _terminate(pg_url, old.session.pid)
    assert old.lost.wait(10)
    assert second.try_lock("least", mode="advisory") is None  # min_until not reached yet

    store = open_store(parse_store_url(pg_url))
    try:
        wait_until_freed(store, namespace, "least", old.record.min_until_us)
    finally:
        store.close()
    new = second.try_lock("least", mode="advisory")
    assert new is not None
    assert new.fence > old.fence
    assert new.record.acquired_us < old.record.expires_us  # long before the row's expiry
    new.release()
    old.release()


def test_a_frozen_holders_session_is_ended_once_its_lease_has_expired(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    # A holder that stops renewing (stopped, paused, starved) keeps its idle session, and
    # its kernel keeps the connection up: its lease row expires, its advisory lock would not.
    first, second = fleets
    frozen = first.try_lock("frozen", mode="advisory", lock_at_most="1s", keepalive=False)
    assert isinstance(frozen, SyncAdvisoryLease)
    assert second.try_lock("frozen", mode="advisory") is None  # before its expiry: held
    assert not frozen.lost.is_set()

    store = open_store(parse_store_url(pg_url))
    try:
        wait_until_freed(store, namespace, "frozen", frozen.record.expires_us)
    finally:
        store.close()
    taken = second.try_lock("frozen", mode="advisory", lock_at_most="10m")
    assert taken is not None
    assert taken.fence > frozen.fence
    assert frozen.lost.wait(10), "the frozen holder did not see its session end"
    assert _sessions_holding(pg_url, namespace, "frozen") == 1
    frozen.release()
    taken.release()


def test_a_session_of_another_application_on_the_same_key_is_never_ended(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    first, _ = fleets
    plain = first.try_lock("shared-key", lock_at_most="100ms", keepalive=False)
    assert plain is not None  # a lease row, expired by the time the contender comes
    with psycopg.connect(pg_url, autocommit=True, application_name="billing") as other:
        other.execute("SELECT pg_advisory_lock(%s)", (advisory_key(namespace, "shared-key"),))
        store = open_store(parse_store_url(pg_url))
        try:
            wait_until_freed(store, namespace, "shared-key", plain.record.expires_us)
        finally:
            store.close()
        assert first.try_lock("shared-key", mode="advisory") is None
        assert other.execute("SELECT 1").fetchone() == (1,)  # still connected
    taken = first.try_lock("shared-key", mode="advisory")
    assert taken is not None
    taken.release()


@pytest.mark.parametrize(
    ("why", "change"),
    [
        (
            "written before the server started",
            "acquired_at = pg_postmaster_start_time() - interval '1s'",
        ),
        # A fence below its acquisition's clock plus the timeline's offset was issued on an
        # earlier timeline: the row came from the primary this server was promoted over.
        ("written on an earlier timeline", "fence = fence - fleetcron_timeline_offset_us() - 1"),
    ],
)
def test_a_row_the_server_may_not_have_seen_the_session_of_is_waited_out(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str, why: str, change: str
) -> None:
    first, second = fleets
    old = first.try_lock("restarted", mode="advisory", lock_at_most="10m")
    assert isinstance(old, SyncAdvisoryLease)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE fleetcron_lease SET {change} WHERE namespace = %s AND name = %s",
            (namespace, "restarted"),
        )
    _terminate(pg_url, old.session.pid)
    assert old.lost.wait(10)
    # Its session is gone, but a restart or a failover would have dropped it unseen too.
    assert second.try_lock("restarted", mode="advisory") is None, why
    assert _sessions_holding(pg_url, namespace, "restarted") == 0
    old.release()


def test_the_async_face_cancels_the_work_of_a_holder_whose_session_ends(
    pg_url: str, namespace: str
) -> None:
    async def scenario() -> None:
        async with (
            await AsyncFleet.connect(pg_url, namespace=namespace) as first,
            await AsyncFleet.connect(pg_url, namespace=namespace) as second,
        ):
            lease = await first.lock("async", mode="advisory", lock_at_most="10m")
            assert isinstance(lease, AdvisoryLease)
            assert await second.try_lock("async", mode="advisory") is None
            started = asyncio.Event()

            async def work() -> None:
                async with lease:
                    started.set()
                    await asyncio.sleep(60)

            task = asyncio.create_task(work())
            await started.wait()
            await asyncio.to_thread(_terminate, pg_url, lease.session.pid)
            with pytest.raises(LeaseLost):
                await asyncio.wait_for(task, 10)
            taken = await second.try_lock("async", mode="advisory", wait="10s")
            assert taken is not None
            assert taken.fence > lease.fence
            await taken.release()

    asyncio.run(scenario())


def test_advisory_locks_lists_the_held_locks_with_their_sessions(
    fleets: tuple[Fleet, Fleet], namespace: str
) -> None:
    first, second = fleets
    lease = first.try_lock("listed", mode="advisory")
    assert isinstance(lease, SyncAdvisoryLease)
    plain = first.try_lock("plain")
    assert plain is not None
    (hold,) = second.advisory_locks()
    assert hold.name == "listed"
    assert hold.pid == lease.session.pid
    assert hold.application_name == f"fleetcron advisory {namespace}/listed"
    assert hold.held_for_us is not None
    assert hold.held_for_us >= 0
    lease.release()
    plain.release()
    assert second.advisory_locks() == []


def test_a_locked_function_runs_under_an_advisory_lock_or_is_skipped(
    fleets: tuple[Fleet, Fleet], pg_url: str, namespace: str
) -> None:
    first, second = fleets
    seen: list[int] = []

    @first.locked("decorated", mode="advisory")
    def job() -> str:
        seen.append(_sessions_holding(pg_url, namespace, "decorated"))
        assert second.try_lock("decorated", mode="advisory") is None
        return "ran"

    assert job() == "ran"
    assert seen == [1]
    assert _sessions_holding(pg_url, namespace, "decorated") == 0
    with second.lock("decorated", mode="advisory"):
        assert job() is None  # skipped while held


@pytest.mark.parametrize("kind", ["memory", "sqlite", "mysql", "redis"])
def test_advisory_mode_is_refused_on_any_other_store(
    kind: str, tmp_path: Path, namespace: str
) -> None:
    url = url_of(kind, tmp_path)
    with Fleet(url, namespace=namespace) as fleet:
        with pytest.raises(ConfigurationError, match="needs a PostgreSQL store") as refused:
            fleet.try_lock("report", mode="advisory")
        assert fleet.store.url in refused.value.message
        assert fleet.get("report") is None  # nothing was written
        assert fleet.advisory_locks() == []


def test_an_unknown_lock_mode_is_refused(fleets: tuple[Fleet, Fleet]) -> None:
    first, _ = fleets
    with pytest.raises(ConfigurationError, match="lock mode must be one of"):
        first.try_lock("report", mode="session")  # type: ignore[arg-type]


def test_advisory_mode_is_refused_behind_transaction_pooling(
    pgbouncer: PgBouncer, pg_url: str, namespace: str
) -> None:
    with Fleet(pgbouncer.store_url, namespace=namespace) as fleet:
        with pytest.raises(ConfigurationError, match="pools per transaction"):
            fleet.try_lock("report", mode="advisory")
        assert fleet.get("report") is None
        assert fleet.try_lock("report") is not None  # lock mode lease works behind it
    assert _sessions_holding(pg_url, namespace, "report") == 0


def test_advisory_mode_works_behind_session_pooling(
    tmp_path: Path, pg_url: str, namespace: str
) -> None:
    bouncer = PgBouncer(tmp_path, pg_url, pool_mode="session")
    try:
        with (
            Fleet(bouncer.store_url, namespace=namespace) as first,
            Fleet(bouncer.store_url, namespace=namespace) as second,
        ):
            held = first.try_lock("pooled", mode="advisory")
            assert held is not None
            assert second.try_lock("pooled", mode="advisory") is None
            held.release()
            eventually(lambda: _sessions_holding(pg_url, namespace, "pooled") == 0)
            again = second.try_lock("pooled", mode="advisory")
            assert again is not None
            assert again.fence > held.fence
            again.release()
    finally:
        bouncer.stop()
