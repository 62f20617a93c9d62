"""Schema: created on first use, ``migrate()`` idempotent, a newer schema refused."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetcron import AsyncFleet, Fleet, SchemaError, StoreMissing
from fleetcron.stores import (
    SyncStore,
    open_async_store,
    open_existing_store,
    open_store,
    parse_store_url,
)
from fleetcron.stores.sql.files import load_migrations

SQL_BACKENDS = pytest.mark.parametrize(
    "backend_url", ["sqlite", "postgres", "mysql"], indirect=True
)


def _with_database(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))


@contextlib.contextmanager
def fresh_database(backend_url: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty store of the same backend: a new file or database."""
    kind = parse_store_url(backend_url).kind
    database = f"fleetcron_fresh_{uuid.uuid4().hex[:12]}"
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / f'{database}.db'}"
        return
    if kind == "postgres":
        import psycopg

        with psycopg.connect(backend_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        try:
            yield _with_database(backend_url, database)
        finally:
            with psycopg.connect(backend_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        return
    if kind == "mysql":
        import pymysql

        from fleetcron.stores.sql.mysql import connect_args

        args = connect_args(parse_store_url(backend_url))
        args.pop("init_command", None)
        my_admin = pymysql.connect(**args)
        try:
            with my_admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{database}`")
            yield _with_database(backend_url, database)
        finally:
            with my_admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
            my_admin.close()
        return
    yield backend_url  # memory and Redis keep no schema


@pytest.fixture
def fresh_url(backend_url: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty store of the same backend: a new file or database."""
    with fresh_database(backend_url, tmp_path) as url:
        yield url


def test_migrate_is_idempotent(store: SyncStore, namespace: str) -> None:
    store.migrate()

    assert store.migrate() == []
    assert store.migrate() == []
    assert store.run(store.ops.lease_acquire(namespace, "job", "holder-1", 1_000_000, 0))


def test_a_fresh_store_creates_its_schema_on_first_use(fresh_url: str, namespace: str) -> None:

    with Fleet(fresh_url, namespace=namespace) as fleet:
        lease = fleet.try_lock("job", keepalive=False)
        assert lease is not None
        assert [record.name for record in fleet.locks()] == ["job"]
        assert fleet.store.migrate() == []


async def test_an_async_fleet_on_a_fresh_store_creates_its_schema_on_connect(
    fresh_url: str, namespace: str
) -> None:
    async with await AsyncFleet.connect(fresh_url, namespace=namespace) as fleet:
        lease = await fleet.try_lock("job", keepalive=False)
        assert lease is not None
        assert [record.name for record in await fleet.locks()] == ["job"]
        assert await fleet.store.migrate() == []


@SQL_BACKENDS
def test_without_auto_migrate_operations_fail_with_schema_error_until_migrate_applies_each_once(
    fresh_url: str, namespace: str
) -> None:
    store = open_store(parse_store_url(fresh_url), auto_migrate=False)
    try:
        with pytest.raises(SchemaError, match="schema missing"):
            store.run(store.ops.lease_get(namespace, "job"))

        expected = [m.name for m in load_migrations(store.dialect)]  # type: ignore[attr-defined]
        assert expected[:2] == ["0001_leases.sql", "0002_ledger.sql"]
        assert store.migrate() == expected
        assert store.migrate() == []
        assert store.run(store.ops.lease_acquire(namespace, "job", "holder-1", 1_000_000, 0))
    finally:
        store.close()


@SQL_BACKENDS
def test_a_schema_newer_than_this_code_is_refused_at_open(fresh_url: str) -> None:
    store = open_store(parse_store_url(fresh_url))
    try:
        store.execute_text(  # type: ignore[attr-defined]
            store.queries["schema_record"],  # type: ignore[attr-defined]
            {"version": 999, "name": "9999_from_the_future.sql"},
        )
    finally:
        store.close()

    with pytest.raises(SchemaError, match="newer"):
        open_store(parse_store_url(fresh_url))


@SQL_BACKENDS
async def test_a_store_opened_as_it_is_is_neither_created_nor_upgraded(fresh_url: str) -> None:
    url = parse_store_url(fresh_url)
    with pytest.raises(StoreMissing, match="no fleetcron store"):
        open_existing_store(url)
    with pytest.raises(StoreMissing, match="no fleetcron store"):
        await open_async_store(url, existing=True)
    if url.path is not None:
        assert not url.path.exists()  # SQLite: not even the file
    else:
        with contextlib.closing(open_store(url, create=False)) as empty:
            assert empty.schema_version() == 0  # type: ignore[attr-defined]

    with contextlib.closing(open_store(url)) as store:
        latest = store.schema_version()  # type: ignore[attr-defined]
        store.execute_text(f"DELETE FROM fleetcron_schema WHERE version = {latest}")  # type: ignore[attr-defined]
    with pytest.raises(SchemaError, match="older than this fleetcron's"):
        open_existing_store(url)
    with pytest.raises(SchemaError, match="older than this fleetcron's"):
        await open_async_store(url, existing=True)
    with contextlib.closing(open_store(url, create=False)) as older:
        assert older.schema_version() == latest - 1  # type: ignore[attr-defined]


@SQL_BACKENDS
def test_concurrent_first_starts_on_a_fresh_store_all_succeed_and_migrate_once(
    fresh_url: str,
) -> None:
    code = (
        "import sys\n"
        "from fleetcron.stores import open_store, parse_store_url\n"
        "open_store(parse_store_url(sys.argv[1])).close()\n"
    )
    starters = [
        subprocess.Popen([sys.executable, "-c", code, fresh_url], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for starter in starters:
        _, err = starter.communicate(timeout=60)
        assert starter.returncode == 0, err.decode()

    store = open_store(parse_store_url(fresh_url), auto_migrate=False)
    try:
        rows = store.execute_text("SELECT version FROM fleetcron_schema").rows  # type: ignore[attr-defined]
        versions = [m.version for m in load_migrations(store.dialect)]  # type: ignore[attr-defined]
        assert sorted(int(r[0]) for r in rows) == versions  # each applied exactly once
    finally:
        store.close()
