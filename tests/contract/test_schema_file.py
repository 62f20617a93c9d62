"""``<dialect>/schema.sql`` is the schema the migrations build, in one file to read.

Each SQL backend builds one fresh database by the migrations and another from the schema
file; their catalogs — tables and columns, indexes, constraints and (PostgreSQL) functions
— must be the same. The version table of the migrations is left out: the file is for
reading, not applying.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from contract.test_schema import SQL_BACKENDS, fresh_database
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.files import load_schema
from fleetcron.stores.sql.mysql import connect_args

Catalog = list[tuple[object, ...]]


def _normal(text: object) -> object:
    return re.sub(r"\s+", " ", text).strip() if isinstance(text, str) else text


def _apply_schema_file(url: str) -> None:
    store_url = parse_store_url(url)
    statements = load_schema(store_url.kind)
    assert statements, "the schema file is empty"
    if store_url.kind == "sqlite":
        assert store_url.path is not None
        with sqlite3.connect(store_url.path) as lite:
            for statement in statements:
                lite.execute(statement)
    elif store_url.kind == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            for statement in statements:
                pg.execute(statement)
    else:
        my = _mysql(url)
        try:
            cur = my.cursor()
            for statement in statements:
                cur.execute(statement)
            cur.close()
        finally:
            my.close()


def _mysql(url: str) -> Any:
    import pymysql

    args = connect_args(parse_store_url(url))
    args.pop("init_command", None)
    return pymysql.connect(**args)


def _catalog(url: str) -> Catalog:
    store_url = parse_store_url(url)
    if store_url.kind == "sqlite":
        assert store_url.path is not None
        with sqlite3.connect(store_url.path) as lite:
            entries = lite.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master "
                "WHERE name LIKE 'fleetcron%' AND tbl_name <> 'fleetcron_schema' "
                "ORDER BY type, name"
            ).fetchall()
        return [tuple(_normal(v) for v in row) for row in entries]
    if store_url.kind == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            columns = pg.execute(
                "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
                "column_default FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name LIKE 'fleetcron%' "
                "AND table_name <> 'fleetcron_schema' ORDER BY 1, 3"
            ).fetchall()
            indexes = pg.execute(
                "SELECT tablename, indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = current_schema() AND tablename LIKE 'fleetcron%' "
                "AND tablename <> 'fleetcron_schema' ORDER BY 1, 2"
            ).fetchall()
            constraints = pg.execute(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
                "FROM pg_constraint WHERE conrelid::regclass::text LIKE 'fleetcron%' "
                "AND conrelid::regclass::text <> 'fleetcron_schema' ORDER BY 1, 2"
            ).fetchall()
            functions = pg.execute(
                "SELECT p.proname, pg_get_function_identity_arguments(p.oid), "
                "pg_get_functiondef(p.oid) FROM pg_proc AS p "
                "JOIN pg_namespace AS n ON n.oid = p.pronamespace "
                "WHERE n.nspname = current_schema() AND p.proname LIKE 'fleetcron%' "
                "ORDER BY 1, 2"
            ).fetchall()
        found = [("column", *c) for c in columns] + [("index", *i) for i in indexes]
        found += [("constraint", *c) for c in constraints] + [("function", *f) for f in functions]
        return [tuple(_normal(v) for v in row) for row in found]
    my = _mysql(url)
    try:
        cur = my.cursor()
        cur.execute("SHOW TABLES LIKE 'fleetcron%'")
        tables = sorted(str(row[0]) for row in cur.fetchall())
        catalog: Catalog = []
        for table in tables:
            if table == "fleetcron_schema":
                continue
            cur.execute(f"SHOW CREATE TABLE `{table}`")
            create = str(cur.fetchone()[1])
            catalog.append(("table", table, _normal(re.sub(r" AUTO_INCREMENT=\d+", "", create))))
        cur.execute(
            "SELECT ROUTINE_NAME, ROUTINE_DEFINITION FROM information_schema.ROUTINES "
            "WHERE ROUTINE_SCHEMA = DATABASE() ORDER BY 1"
        )
        catalog += [("routine", *row) for row in cur.fetchall()]
        cur.close()
        return catalog
    finally:
        my.close()


@SQL_BACKENDS
def test_the_schema_file_builds_what_the_migrations_build(backend_url: str, tmp_path: Path) -> None:
    with (
        fresh_database(backend_url, tmp_path) as migrated,
        fresh_database(backend_url, tmp_path) as from_file,
    ):
        open_store(parse_store_url(migrated)).close()  # migrates on first use
        _apply_schema_file(from_file)

        built = _catalog(migrated)
        assert built, "the migrations built nothing"
        assert _catalog(from_file) == built


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_the_schema_file_names_every_table_the_queries_use(dialect: str) -> None:
    text = " ".join(load_schema(dialect))
    for table in ("fleetcron_lease", "fleetcron_run", "fleetcron_job"):
        assert f"CREATE TABLE IF NOT EXISTS {table}" in text, (dialect, table)
