"""PostgreSQL: the lookups of one slot read one row, whatever plan the server makes.

A claim, an outcome and the settled read each look a slot up by its primary key
(namespace, job, slot_us), inside a function or a prepared statement whose plan the
server keeps for the connection (a *generic* plan, made without the values). Two such
plans cost a busy fleet most of its server CPU before: an index whose job column could not
answer the lookup (every job's row of the slot was read instead of one) and a settled read
planned as a hash over every row of the namespace. These tests give the table statistics
like a real ledger's (many jobs per slot, several namespaces), force the generic plan and
read what the executor did.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from contract.test_schema import fresh_database
from fleetcron.models import SlotClaim
from fleetcron.stores import open_store, parse_store_url
from fleetcron.stores.sql.files import load_queries
from fleetcron.stores.sql.postgres import PostgresStore
from services import require_service

JOBS = 40
SLOTS = 300
WIDE_JOBS = 400
SLOT_US = 1_800_000_000_000_000
# The lookup of a slot's row as the claim and finish functions write it.
RUN_LOOKUP = """SELECT r.state, r.expires_us FROM fleetcron_run AS r
 WHERE r.namespace = %(namespace)s::text AND r.job = %(job)s::text
   AND r.slot_us = %(slot_us)s::bigint"""


@contextlib.contextmanager
def _ledger(jobs: int, slots: int) -> Iterator[str]:
    """A migrated database whose ledger holds ``jobs`` x ``slots`` succeeded runs in each
    of three namespaces, analysed."""
    url = require_service("postgres")
    with fresh_database(url, Path()) as fresh:
        open_store(parse_store_url(fresh)).close()  # migrates
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO fleetcron_run
                     (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
                      started_us, finished_us)
                   SELECT 'ns-' || n, 'job-' || lpad(j::text, 5, '0'), %(base)s + s * 1000000,
                          'succeeded', 1, 1, 'h', 'r', 'schedule', 1, 2
                     FROM generate_series(1, 3) n, generate_series(1, %(jobs)s) j,
                          generate_series(1, %(slots)s) s""",
                {"base": SLOT_US, "jobs": jobs, "slots": slots},
            )
            conn.execute("ANALYZE fleetcron_run")
        yield fresh


@pytest.fixture(scope="module")
def ledger() -> Iterator[str]:
    """Few jobs with many slots each (jobs due every second)."""
    with _ledger(JOBS, SLOTS) as url:
        yield url


@pytest.fixture(scope="module")
def wide_ledger() -> Iterator[str]:
    """Many jobs with few slots each."""
    with _ledger(WIDE_JOBS, 6) as url:
        yield url


def _executed(conn: psycopg.Connection[Any], sql: str, params: dict[str, object]) -> list[Any]:
    """The plan nodes of ``sql`` (its ``%(name)s`` parameters as in queries.sql) run once
    under the generic plan of a prepared statement, as EXPLAIN ANALYZE has them."""
    names = list(params)
    numbered = sql
    for index, name in enumerate(names, 1):
        numbered = numbered.replace(f"%({name})s", f"${index}")
    conn.execute("DEALLOCATE ALL")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(pgsql.SQL("PREPARE probe AS ") + pgsql.SQL(numbered))
    values = pgsql.SQL(", ").join(pgsql.Literal(params[name]) for name in names)
    (row,) = conn.execute(
        pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe({})").format(values)
    ).fetchall()
    plan = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    nodes: list[Any] = []
    pending = [plan[0]["Plan"]]
    while pending:
        node = pending.pop()
        nodes.append(node)
        pending.extend(node.get("Plans", ()))
    return nodes


def test_every_index_holding_the_job_compares_it_as_the_lookups_do(ledger: str) -> None:
    # An index whose job column is in another collation than the column's own answers a
    # lookup by (namespace, job, slot_us) on its other columns only: the planner may take
    # it and read every job's row of the slot.
    with psycopg.connect(ledger, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'fleetcron_run'"
        ).fetchall()

    holding_job = {name: definition for name, definition in rows if "job" in definition}
    assert {"fleetcron_run_pkey", "fleetcron_run_newest"} <= set(holding_job)
    assert all("COLLATE" not in definition for definition in holding_job.values()), holding_job


@pytest.mark.parametrize("found", [True, False], ids=["row", "no-row"])
def test_a_slot_lookup_reads_one_index_entry_under_the_generic_plan(
    ledger: str, found: bool
) -> None:
    params = {
        "namespace": "ns-2",
        "job": "job-00023",
        "slot_us": SLOT_US + (3 if found else 999) * 1_000_000,
    }
    with psycopg.connect(ledger, autocommit=True) as conn:
        nodes = _executed(conn, RUN_LOOKUP, params)

    (scan,) = nodes
    assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), scan
    assert "job" in scan["Index Cond"], scan  # all three key columns answer the lookup
    assert scan.get("Rows Removed by Filter", 0) == 0, scan
    assert scan["Actual Rows"] == (1 if found else 0)


def test_the_settled_read_looks_each_slot_up_instead_of_hashing_the_namespace(
    wide_ledger: str,
) -> None:
    pairs = [[f"job-{j:05d}", SLOT_US + 2 * 1_000_000] for j in range(1, 60)]
    pairs.append(["job-99999", SLOT_US + 2 * 1_000_000])  # no row
    sql = load_queries("postgres")["run_settled"]
    with psycopg.connect(wide_ledger, autocommit=True) as conn:
        nodes = _executed(conn, sql, {"namespace": "ns-1", "pairs": json.dumps(pairs)})
        answered = conn.execute(sql, {"namespace": "ns-1", "pairs": json.dumps(pairs)}).fetchall()

    types = [node["Node Type"] for node in nodes]
    assert not {"Hash", "Hash Join"} & set(types), types
    scans = [node for node in nodes if node["Node Type"] in ("Index Scan", "Index Only Scan")]
    assert scans, types
    # One lookup per pair, each reading at most its own row.
    assert all(scan.get("Rows Removed by Filter", 0) == 0 for scan in scans), scans
    assert [scan["Actual Loops"] for scan in scans] == [len(pairs)], scans
    assert nodes[0]["Actual Rows"] == len(pairs) - 1
    assert len(answered) == len(pairs) - 1


def test_the_running_rows_are_read_without_the_finished_or_failed_ones() -> None:
    # A paged status read asks for the runs in progress at every page; the index of open
    # rows holds every failed row as well, kept for the retention.
    with _ledger(JOBS, 30) as url, psycopg.connect(url, autocommit=True) as conn:
        for state, slots, jobs in (("running", [1000], 5), ("failed", range(1001, 1021), JOBS)):
            conn.execute(
                """INSERT INTO fleetcron_run
                     (namespace, job, slot_us, state, attempt, fence, holder, run_id, trigger,
                      started_us, expires_us)
                   SELECT 'ns-1', 'job-' || lpad(j::text, 5, '0'), %(base)s + s * 1000000,
                          %(state)s, 1, 1, 'h', 'r', 'schedule', 1, %(base)s * 2
                     FROM generate_series(1, %(jobs)s) j, unnest(%(slots)s::bigint[]) s""",
                {"base": SLOT_US, "state": state, "slots": list(slots), "jobs": jobs},
            )
        conn.execute("ANALYZE fleetcron_run")
        sql = load_queries("postgres")["run_running"]
        nodes = _executed(conn, sql, {"namespace": "ns-1", "skip": 49})
        answered = conn.execute(sql, {"namespace": "ns-1", "skip": 49}).fetchall()

    assert len(answered) == 5
    scans = [node for node in nodes if "Scan" in node["Node Type"]]
    assert any(node.get("Index Name") == "fleetcron_run_running" for node in scans), scans
    read = sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in scans
    )
    # Each running row and, for each, its job's rows newer than it (a bounded walk): not
    # the 3,600 finished or the 800 failed rows of the namespace.
    assert read <= 5 * 60, (read, scans)


def test_history_reads_are_planned_at_each_call_and_claims_are_prepared(namespace: str) -> None:
    # A prepared plan lasts as long as the connection: a job's history read planned while
    # the ledger was empty went on reading the whole namespace for every job. Such reads
    # are planned at each call; the claims and the outcomes stay prepared.
    url = require_service("postgres")
    store = open_store(parse_store_url(url))
    assert isinstance(store, PostgresStore)
    try:
        ops = store.ops
        now = store.run(ops.store_now())
        for index in range(6):  # psycopg prepares a statement at its 5th run
            slot = now - (index + 1) * 1_000_000
            [answer] = store.run(
                ops.run_claim(
                    namespace,
                    [SlotClaim(job="j", slot_us=slot, run_id="r", exclusive=False)],
                    "h",
                    60_000_000,
                )
            )
            assert answer.run is not None
            store.run(ops.run_list_many(namespace, ["j", "k"], 50))
            store.run(ops.run_running(namespace, ["j", "k"], 50))
            store.run(ops.run_list(namespace, "j", 50))
            store.run(ops.run_list(namespace, None, 50))
            store.run(ops.run_settled(namespace, [("j", slot)]))
            store.run(ops.run_due(namespace, 100))
        rows = store._connection().execute("SELECT statement FROM pg_prepared_statements")
        texts = " ".join(str(row[0]) for row in rows.fetchall())
    finally:
        store.close()

    queries = load_queries("postgres")
    assert _as_prepared(queries["run_claim"]) in texts, texts
    planned = ("run_list", "run_list_job", "run_list_many", "run_running", "run_settled", "run_due")
    for name in planned:
        assert _as_prepared(queries[name]) not in texts, name


def _as_prepared(sql: str) -> str:
    """``sql`` as psycopg prepares it: each ``%(name)s`` numbered by its first place."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, sql)
