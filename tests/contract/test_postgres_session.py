"""PostgreSQL: nothing of an operation lives in the session, and nothing depends on it.

Behind PgBouncer in transaction pooling mode the server connection a transaction runs on
is shared with other clients, so a session setting made by one transaction reaches
another client's, and a setting the code relies on may be missing. The store sets nothing
for the session and its statements keep their rules under any default isolation. The one
thing it leaves there, prepared statements, it leaves only while the backend URL does not
say ``prepared_statements=off``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from fleetcron.models import SlotClaim
from fleetcron.stores import open_async_store, open_store, parse_store_url
from fleetcron.stores.sql.operations import claim_params
from fleetcron.stores.sql.postgres import PostgresStore
from services import require_service

MINUTE = 60_000_000
# The claim statement of a replica of schema version 4, as its queries.sql sent it.
CLAIM_V4 = """SELECT * FROM fleetcron_run_claim(
    %(namespace)s::text, %(job)s::text, %(lease_name)s::text, %(slot_us)s::bigint,
    %(run_id)s::text, %(exclusive)s::boolean, %(max_attempts)s::integer,
    %(trigger)s::text, %(least_us)s::bigint, %(holder)s::text, %(ttl_us)s::bigint,
    %(lost_error)s::text, %(deadline_us)s::bigint, %(missed_error)s::text)"""
# The claim statement of a replica of schema version 10 (the definition check around the
# call), as its queries.sql sent it.
CLAIM_V10 = """WITH stored AS (
    SELECT j.fingerprint FROM fleetcron_job AS j
     WHERE j.namespace = %(namespace)s AND j.job = %(job)s
       AND %(fingerprint)s::text IS NOT NULL
       AND j.fingerprint NOT IN ('', %(fingerprint)s::text)
),
go AS (SELECT %(job)s::text AS job WHERE NOT EXISTS (SELECT 1 FROM stored))
SELECT c.*, NULL::text
  FROM go CROSS JOIN LATERAL fleetcron_run_claim_v3(
    %(namespace)s::text, go.job, %(lease_name)s::text, %(slot_us)s::bigint,
    %(run_id)s::text, %(exclusive)s::boolean, %(max_attempts)s::integer,
    %(trigger)s::text, %(least_us)s::bigint, %(holder)s::text, %(ttl_us)s::bigint,
    %(lost_error)s::text, %(deadline_us)s::bigint, %(missed_error)s::text,
    %(progress)s::boolean, %(pausable)s::boolean) AS c
UNION ALL
SELECT CASE WHEN %(slot_us)s::bigint > now.us THEN 'not_due' ELSE 'conflict' END,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, now.us, stored.fingerprint
  FROM stored, (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) AS now"""
# Settings a client may send at start-up that PgBouncer tracks per client.
# A lease's acquire and release as a replica of schema version 11 sends them.
ACQUIRE_V11 = """WITH now AS (SELECT clock_timestamp() AS t)
INSERT INTO fleetcron_lease AS l
    (namespace, name, holder, fence, acquired_at, expires_at, min_until)
SELECT %(namespace)s, %(name)s, %(holder)s, (extract(epoch FROM now.t) * 1000000)::bigint,
       now.t, now.t + %(ttl_us)s * interval '1 microsecond',
       now.t + %(least_us)s * interval '1 microsecond'
FROM now
ON CONFLICT (namespace, name) DO UPDATE
   SET holder = excluded.holder, fence = greatest(l.fence + 1, excluded.fence),
       acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
       min_until = excluded.min_until
 WHERE l.expires_at <= excluded.acquired_at
RETURNING fence, (extract(epoch FROM acquired_at) * 1000000)::bigint"""
RELEASE_V11 = """WITH now AS (SELECT clock_timestamp() AS t)
UPDATE fleetcron_lease AS l SET expires_at = greatest(now.t, l.min_until)
  FROM now
 WHERE l.namespace = %(namespace)s AND l.name = %(name)s
   AND l.holder = %(holder)s AND l.fence = %(fence)s AND l.expires_at > now.t"""

_CLIENT_SETTINGS_ALLOWED = {"application_name", "client_encoding"}
_SESSION_SETTINGS = """
SELECT name FROM pg_settings WHERE source IN ('session', 'client') ORDER BY name
"""


def _exercise(store: PostgresStore, namespace: str) -> None:
    ops = store.ops
    lease = store.run(ops.lease_acquire(namespace, "report", "h:1:a", 5_000_000, 0))
    assert lease is not None
    assert store.run(ops.lease_extend(namespace, "report", "h:1:a", lease.fence, 5_000_000))
    assert store.run(ops.lease_release(namespace, "report", "h:1:a", lease.fence))
    now = store.run(ops.store_now())
    slot = now - now % MINUTE - MINUTE
    claims = [SlotClaim(job=job, slot_us=slot, run_id=job) for job in ("a", "b", "c")]
    answers = store.run(ops.run_claim(namespace, claims, "h:1:b", 5_000_000))
    assert [a.status for a in answers] == ["claimed"] * 3


def _custom_setting(conn: psycopg.Connection[tuple[object, ...]]) -> object:
    row = conn.execute("SELECT current_setting('fleetcron.batch_now', true)").fetchone()
    assert row is not None
    return row[0]


def test_no_setting_of_the_sync_store_outlives_its_statements(namespace: str) -> None:
    url = require_service("postgres")
    store = open_store(parse_store_url(url))
    assert isinstance(store, PostgresStore)
    try:
        _exercise(store, namespace)
        conn = store._connection()
        names = {row[0] for row in conn.execute(_SESSION_SETTINGS).fetchall()}
        assert names <= _CLIENT_SETTINGS_ALLOWED, f"session-level settings left: {names}"
        assert _custom_setting(conn) is None, "a batch left its clock in the session"
    finally:
        store.close()


@pytest.mark.parametrize(("query", "prepared"), [("", True), ("?prepared_statements=off", False)])
def test_the_store_prepares_what_it_runs_often_unless_the_url_says_off(
    namespace: str, query: str, prepared: bool
) -> None:
    url = require_service("postgres")
    store = open_store(parse_store_url(url + query))
    assert isinstance(store, PostgresStore)
    try:
        ops = store.ops
        for _ in range(6):  # psycopg prepares a statement at its 5th run on a connection
            lease = store.run(ops.lease_acquire(namespace, "often", "h:1:a", 5_000_000, 0))
            assert lease is not None
            assert store.run(ops.lease_release(namespace, "often", "h:1:a", lease.fence))
        conn = store._connection()
        rows = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        texts = " ".join(str(row[0]) for row in rows)
        assert ("fleetcron_lease_acquire_v1(" in texts) is prepared, texts
        assert ("fleetcron_lease_release_v1(" in texts) is prepared, texts
        assert (len(rows) > 0) is prepared
    finally:
        store.close()


async def test_no_setting_of_the_async_store_outlives_its_statements(namespace: str) -> None:
    url = require_service("postgres")
    store = await open_async_store(parse_store_url(url))
    try:
        now = await store.run(store.ops.store_now())
        slot = now - now % MINUTE - MINUTE
        claims = [SlotClaim(job=job, slot_us=slot, run_id=job) for job in ("a", "b")]
        answers = await store.run(store.ops.run_claim(namespace, claims, "h:1:b", 5_000_000))
        assert [a.status for a in answers] == ["claimed", "claimed"]
        result = await store._execute_text(_SESSION_SETTINGS, {})  # type: ignore[attr-defined]
        names = {row[0] for row in result.rows}
        assert names <= _CLIENT_SETTINGS_ALLOWED, f"session-level settings left: {names}"
        result = await store._execute_text(  # type: ignore[attr-defined]
            "SELECT current_setting('fleetcron.batch_now', true)", {}
        )
        assert result.rows[0][0] is None, "a batch left its clock in the session"
    finally:
        await store.close()


@pytest.fixture(scope="module")
def serializable_url() -> Iterator[str]:
    """A database of its own whose default isolation is SERIALIZABLE."""
    base = require_service("postgres")
    name = f"fleetcron_ser_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(
            f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'serializable'"
        )
    head, _, _ = base.rpartition("/")
    try:
        yield f"{head}/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_racing_acquirers_keep_mutual_exclusion_under_a_serializable_default(
    serializable_url: str, namespace: str
) -> None:
    stores = [open_store(parse_store_url(serializable_url)) for _ in range(6)]
    try:
        conn = stores[0]._connection()  # type: ignore[attr-defined]
        row = conn.execute("SHOW default_transaction_isolation").fetchone()
        assert row[0] == "serializable"  # the condition under test holds
        rounds = 40
        winners: list[list[int]] = [[] for _ in range(rounds)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(stores))

        def race(index: int) -> None:
            store = stores[index]
            try:
                for number in range(rounds):
                    barrier.wait(timeout=30)
                    name = f"race-{number}"
                    got = store.run(
                        store.ops.lease_acquire(namespace, name, f"h:{index}:x", 60_000_000, 0)
                    )
                    if got is not None:
                        winners[number].append(index)
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        assert all(len(round_winners) == 1 for round_winners in winners), winners
    finally:
        for store in stores:
            store.close()


async def test_racing_batch_claims_keep_every_slot_once_under_a_serializable_default(
    serializable_url: str, namespace: str
) -> None:
    stores = [await open_async_store(parse_store_url(serializable_url)) for _ in range(4)]
    try:
        now = await stores[0].run(stores[0].ops.store_now())
        slot = now - now % MINUTE - MINUTE
        jobs = [f"job-{n}" for n in range(30)]

        async def claim_all(index: int) -> list[str]:
            store = stores[index]
            order = jobs[index:] + jobs[:index]  # each replica in its own order
            claims = [SlotClaim(job=job, slot_us=slot, run_id=f"{index}-{job}") for job in order]
            answers = await store.run(
                store.ops.run_claim(namespace, claims, f"h:{index}", 60_000_000)
            )
            return [a.job for a in answers if a.status == "claimed"]

        won = await asyncio.gather(*(claim_all(i) for i in range(len(stores))))
        everything = [job for replica in won for job in replica]
        assert sorted(everything) == sorted(jobs), "every slot claimed exactly once"
    finally:
        for store in stores:
            await store.close()


@pytest.mark.parametrize(("version", "old_text"), [(4, CLAIM_V4), (10, CLAIM_V10)])
def test_replicas_of_a_previous_and_the_new_schema_version_share_a_store(
    namespace: str, version: int, old_text: str
) -> None:
    """A rolling upgrade: a replica still on schema version 4 (fleetcron_run_claim) or 10
    (fleetcron_run_claim_v3) claims beside an upgraded one sending the claim of today's
    queries.sql, on the same slots; each slot runs once."""
    url = require_service("postgres")
    store = open_store(parse_store_url(url))  # migrated to the newest version
    assert isinstance(store, PostgresStore)
    new_text = store.queries["run_claim"]
    assert "fleetcron_run_claim_v4(" in new_text
    assert version < store.latest_version
    now = store.run(store.ops.store_now())
    slot = now - now % MINUTE - MINUTE
    jobs = [f"job-{n}" for n in range(40)]
    won: dict[str, list[str]] = {"old": [], "new": []}
    errors: list[BaseException] = []

    def replica(version: str, text: str, order: list[str]) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                for job in order:
                    claim = SlotClaim(job=job, slot_us=slot, run_id=f"{version}-{job}")
                    params = claim_params(namespace, claim, f"host:{version}", 60_000_000)
                    row = conn.execute(text, params).fetchone()
                    assert row is not None
                    if row[0] == "claimed":
                        won[version].append(job)
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [
            threading.Thread(target=replica, args=("old", old_text, jobs)),
            threading.Thread(target=replica, args=("new", new_text, jobs[::-1])),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert sorted(won["old"] + won["new"]) == sorted(jobs), "every slot claimed once"
        assert won["old"], "the old replica claimed nothing: the race did not happen"
        assert won["new"], "the new replica claimed nothing: the race did not happen"
        rows = {r.job: r for r in store.run(store.ops.run_list(namespace, None, 100))}
        assert all(rows[job].state == "running" for job in jobs)
    finally:
        store.close()


def test_lease_statements_of_the_previous_and_the_new_schema_version_share_a_store(
    namespace: str,
) -> None:
    """A rolling upgrade: a replica of schema version 11 (the statements) and an upgraded
    one (the functions of migration 12) take turns on the same leases. Each round one side
    takes the lease, the other is refused while it is held, and the first releases it; the
    fences of the two keep increasing."""
    url = require_service("postgres")
    store = open_store(parse_store_url(url))  # migrated to the newest version
    assert isinstance(store, PostgresStore)
    assert "fleetcron_lease_acquire_v1(" in store.queries["lease_acquire"]
    rounds = 40
    fences: list[list[int]] = [[], [], []]
    refused: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def old_acquire(conn: psycopg.Connection[tuple[object, ...]], name: str) -> int | None:
        params = {
            "namespace": namespace,
            "name": name,
            "holder": "old:1:t",
            "ttl_us": 60_000_000,
            "least_us": 0,
        }
        row = conn.execute(ACQUIRE_V11, params).fetchone()
        return None if row is None else int(str(row[0]))

    def old_release(conn: psycopg.Connection[tuple[object, ...]], name: str, fence: int) -> bool:
        params = {"namespace": namespace, "name": name, "holder": "old:1:t", "fence": fence}
        return conn.execute(RELEASE_V11, params).rowcount == 1

    def replica(side: str) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                for number in range(rounds):
                    name = f"up-{number % 3}"
                    first = "old" if number % 2 == 0 else "new"
                    fence = None
                    if side == first:
                        if side == "old":
                            fence = old_acquire(conn, name)
                        else:
                            got = store.run(
                                store.ops.lease_acquire(namespace, name, "new:1:t", 60_000_000, 0)
                            )
                            fence = None if got is None else got.fence
                        assert fence is not None, f"round {number}: {side} could not take {name}"
                        fences[number % 3].append(fence)
                    barrier.wait(timeout=30)
                    if side != first:
                        if side == "old":
                            taken = old_acquire(conn, name) is not None
                        else:
                            taken = (
                                store.run(
                                    store.ops.lease_acquire(
                                        namespace, name, "new:1:t", 60_000_000, 0
                                    )
                                )
                                is not None
                            )
                        assert not taken, (
                            f"round {number}: {side} took {name} while {first} held it"
                        )
                        refused.append(side)
                    barrier.wait(timeout=30)
                    if fence is not None:
                        if side == "old":
                            assert old_release(conn, name, fence)
                        else:
                            assert store.run(
                                store.ops.lease_release(namespace, name, "new:1:t", fence)
                            )
                    barrier.wait(timeout=30)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=replica, args=(side,)) for side in ("old", "new")]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a replica hung"
        assert not errors, errors
        assert sorted(set(refused)) == ["new", "old"]
        assert len(refused) == rounds
        for name, handed in enumerate(fences):
            assert handed == sorted(set(handed)), f"fences of up-{name} not increasing: {handed}"
    finally:
        store.close()
