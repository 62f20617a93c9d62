"""Store operations driven without a database: statements out, canned results in.

Each operation is a generator that yields statements (``fleetcron.stores.statements``);
these tests play the runner with a fake ``execute`` that records what was asked and answers
with canned rows or replies, so what is checked is exactly the operation's logic: which statement,
which bound parameters, how the result maps back.
"""

from __future__ import annotations

import re
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from fleetcron.local_holder import LocalHolder
from fleetcron.models import LeaseRecord, SlotClaim
from fleetcron.stores.base import Statement, drive, drive_async
from fleetcron.stores.redis.keys import lease_key, namespace_pattern
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.scripts import SCRIPTS
from fleetcron.stores.redis.statements import KeyScan, Script, fan_out
from fleetcron.stores.rows import LEASES, RUNS
from fleetcron.stores.sql.files import load_migrations, load_queries, split_statements
from fleetcron.stores.sql.operations import SqlLedger, SqlOperations
from fleetcron.stores.sql.sqlite_operations import SqliteOperations
from fleetcron.stores.sql.statements import Query, QueryBatch, SqlResult
from unit.fakes import HERE, HOLDER_COLUMNS, FakeExecute, GoneHolders

DIALECTS = ("sqlite", "postgres", "mysql")
# A canned result names its columns as the statement's text does.
LEASE = LEASES.columns  # name, holder, fence, acquired_us, expires_us, min_until_us, now_us
ROW = ("job", "host:1:abc", 7, 1_000, 2_000, 1_500, 1_200)
RECORD = LeaseRecord(
    namespace="ns",
    name="job",
    holder="host:1:abc",
    fence=7,
    acquired_us=1_000,
    expires_us=2_000,
    min_until_us=1_500,
    now_us=1_200,
)


def rows(
    *found: tuple[Any, ...], columns: tuple[str, ...] = (), rowcount: int | None = None
) -> SqlResult:
    count = len(found) if rowcount is None else rowcount
    return SqlResult(rows=list(found), rowcount=count, columns=columns)


def leases(*found: tuple[Any, ...], rowcount: int | None = None) -> SqlResult:
    return rows(*found, columns=LEASE, rowcount=rowcount)


# -- SQL operations ----------------------------------------------------------------------
SQL = SqlOperations()


def test_sql_acquire_is_one_statement_binding_every_lease_term() -> None:
    # The row of the PostgreSQL function: (r_fence, r_now_us), read without the prefix.
    execute = FakeExecute(rows((7, 1_000), columns=("r_fence", "r_now_us")))

    record = drive(SQL.lease_acquire("ns", "job", "host:1:abc", 1_000, 500), execute)

    assert record == replace(RECORD, now_us=1_000)
    assert execute.statements == [
        Query(
            "lease_acquire",
            {
                "namespace": "ns",
                "name": "job",
                "holder": "host:1:abc",
                "ttl_us": 1_000,
                "least_us": 500,
            },
        )
    ]


def test_sql_acquire_returns_none_when_the_statement_returns_no_row() -> None:
    assert drive(SQL.lease_acquire("ns", "job", "h", 1, 0), FakeExecute(rows())) is None


MYSQL = SqlOperations(creates_rows=True)


def test_mysql_acquire_is_refused_when_its_update_matched_nothing() -> None:
    # The row another holder has.
    execute = FakeExecute(rows((7, 1_000), columns=("fence", "now_us"), rowcount=0))

    assert drive(MYSQL.lease_acquire("ns", "job", "host:1:abc", 1, 0), execute) is None
    assert execute.names == ["lease_acquire"]


def test_mysql_acquire_of_a_new_name_creates_the_row_then_acquires_once_more() -> None:
    execute = FakeExecute(
        rows(rowcount=0), rows(rowcount=1), rows((7, 1_000), columns=("fence", "now_us"))
    )

    record = drive(MYSQL.lease_acquire("ns", "job", "host:1:abc", 1_000, 500), execute)

    assert record == replace(RECORD, now_us=1_000)
    assert execute.names == ["lease_acquire", "lease_create", "lease_acquire"]
    assert execute.statements[1] == Query("lease_create", {"namespace": "ns", "name": "job"})


def test_extend_is_refused_when_the_update_matched_nothing_even_if_a_row_came_back() -> None:
    execute = FakeExecute(leases(ROW, rowcount=0))

    assert drive(MYSQL.lease_extend("ns", "job", "host:1:abc", 7, 1), execute) is None


def test_sql_rows_from_binary_columns_and_numeric_types_map_to_text_and_int() -> None:
    # MySQL VARBINARY names come back as bytes; PostgreSQL numerics may be Decimal.
    raw = ("naïve ☃".encode(), b"host:1:abc", Decimal(7), Decimal(1_000), 2_000, 1_500, 1_200)

    record = drive(SQL.lease_get("ns", "naïve ☃"), FakeExecute(leases(raw)))

    assert record is not None
    assert (record.name, record.holder, record.fence) == ("naïve ☃", "host:1:abc", 7)
    assert type(record.fence) is int
    assert type(record.acquired_us) is int


def test_sql_extend_binds_holder_fence_and_length_and_maps_the_row() -> None:
    execute = FakeExecute(leases(ROW))

    record = drive(SQL.lease_extend("ns", "job", "host:1:abc", 7, 9_000), execute)

    assert record == RECORD
    assert execute.statements == [
        Query(
            "lease_extend",
            {"namespace": "ns", "name": "job", "holder": "host:1:abc", "fence": 7, "ttl_us": 9_000},
        )
    ]


def test_sql_extend_returns_none_when_not_held() -> None:
    assert drive(SQL.lease_extend("ns", "job", "h", 7, 9_000), FakeExecute(rows())) is None


@pytest.mark.parametrize(
    ("result", "released"),
    [
        (rows((1,)), True),  # RETURNING 1 (PostgreSQL, SQLite)
        (rows(rowcount=1), True),  # matched rows of an UPDATE (MySQL, CLIENT_FOUND_ROWS)
        (rows(rowcount=0), False),
        (rows(rowcount=-1), False),  # driver does not know: no row came back
    ],
)
def test_sql_release_reports_whether_a_row_was_ours(result: SqlResult, released: bool) -> None:
    execute = FakeExecute(result)

    assert drive(SQL.lease_release("ns", "job", "h", 7), execute) is released
    assert execute.statements == [
        Query("lease_release", {"namespace": "ns", "name": "job", "holder": "h", "fence": 7})
    ]


def test_sql_get_maps_the_row_or_none() -> None:
    execute = FakeExecute(leases(ROW), rows())

    assert drive(SQL.lease_get("ns", "job"), execute) == RECORD
    assert drive(SQL.lease_get("ns", "job"), execute) is None
    assert execute.statements == [Query("lease_get", {"namespace": "ns", "name": "job"})] * 2


def test_sql_list_maps_every_row_in_the_order_the_store_sorted_them() -> None:
    second = ("k", "h2", 9, 1, 2, 1, 3)
    execute = FakeExecute(leases(ROW, second), rows())

    listed = drive(SQL.lease_list("ns"), execute)

    assert [r.name for r in listed] == ["job", "k"]
    assert listed[0] == RECORD
    assert drive(SQL.lease_list("ns"), execute) == []
    assert execute.names == ["lease_list", "lease_list"]
    assert execute.statements[0] == Query("lease_list", {"namespace": "ns"})


@pytest.mark.parametrize(
    ("dry_run", "statement"), [(True, "lease_prune_preview"), (False, "lease_prune")]
)
def test_sql_prune_uses_the_preview_for_a_dry_run_and_returns_sorted_names(
    dry_run: bool, statement: str
) -> None:
    execute = FakeExecute(rows(("b",), (b"a",), ("c",), columns=("name",)))

    pruned = drive(SQL.lease_prune("ns", 60_000_000, dry_run), execute)

    assert pruned == ["a", "b", "c"]
    assert execute.statements == [
        Query(statement, {"namespace": "ns", "older_than_us": 60_000_000})
    ]


def test_sql_claim_answers_each_slot_from_its_one_row_of_status_and_run_columns() -> None:
    claims = [SlotClaim(job=job, slot_us=1_000, run_id=f"r-{job}") for job in ("a", "b", "c")]
    run_row = (b"b", 1_000, "running", 1, 9, "h", "r-b", "schedule", 5, None, 6, None, 0)
    nulls = (None,) * 18
    # One row per claim: the status, the run's columns, the registered fingerprint.
    columns = ("status", *RUNS.columns, "stored_fingerprint")
    execute = FakeExecute(
        [
            rows(("busy", *nulls), columns=columns),
            rows((b"claimed", *run_row, None, None, None, 5, None), columns=columns),
            rows(("taken", *nulls), columns=columns),
        ]
    )

    answers = drive(SqlLedger().run_claim("ns", claims, "h", 1), execute)

    assert [(a.job, a.status) for a in answers] == [("a", "busy"), ("b", "claimed"), ("c", "taken")]
    assert answers[0].run is None
    assert answers[2].run is None
    run = answers[1].run
    assert run is not None
    assert (run.job, run.fence, run.run_id, run.expires_us, run.now_us) == ("b", 9, "r-b", 6, 5)
    [statement] = execute.statements
    assert isinstance(statement, QueryBatch)
    assert statement.name == "run_claim"
    assert [p["job"] for p in statement.batch] == ["a", "b", "c"]


def test_sql_backfill_is_one_query_of_the_slots_as_a_json_array_each_once_in_order() -> None:
    execute = FakeExecute(rows((4,), columns=("count",)))

    assert drive(SqlLedger().run_backfill("ns", "job", [30, 10, 30, 20]), execute) == 4
    assert drive(SqlLedger().run_backfill("ns", "job", []), execute) == 0
    assert execute.statements == [
        Query("run_backfill", {"namespace": "ns", "job": "job", "slots": "[10, 20, 30]"})
    ]


def _sql_statements_of_every_operation(dialect: str = "postgres") -> list[Query]:
    execute = FakeExecute(*[rows()] * 8)
    ops = SQL
    if dialect == "sqlite":
        # SQLite's acquire of a lease whose holder is gone from the host: every statement
        # of the takeover is sent (the holder's row, its release, the acquire again).
        ops = SqliteOperations(GoneHolders())
        found = rows(("h", 1, 2, 3, 4), columns=HOLDER_COLUMNS)
        execute = FakeExecute(rows(), rows(), found, rows((1,)), *[rows()] * 8)
        drive(ops.lease_group("ns", "n", "h", 1, 0), execute)
    drive(ops.lease_acquire("ns", "n", "h", 1, 0), execute)
    drive(ops.lease_extend("ns", "n", "h", 1, 1), execute)
    drive(ops.lease_release("ns", "n", "h", 1), execute)
    drive(ops.lease_get("ns", "n"), execute)
    drive(ops.lease_list("ns"), execute)
    drive(ops.lease_prune("ns", 1, True), execute)
    drive(ops.lease_prune("ns", 1, False), execute)
    queries = [statement for statement in execute.statements if isinstance(statement, Query)]
    assert len(queries) == len(execute.statements)
    return queries


STORE_QUERIES = {
    "sqlite": {"schema_version", "schema_init", "schema_record"},
    "postgres": {
        "schema_version",
        "schema_init",
        "schema_record",
        "migration_settings",
        "migration_lock",
    },
    "mysql": {
        "schema_version",
        "schema_init",
        "schema_record",
        "migration_lock",
        "migration_unlock",
    },
}
PLACEHOLDER = {
    "sqlite": r":([a-z_]+)\b",
    "postgres": r"%\(([a-z_]+)\)s",
    "mysql": r"%\(([a-z_]+)\)s",
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_defines_every_query_the_operations_and_its_store_use(dialect: str) -> None:
    queries = load_queries(dialect)
    used = {statement.name for statement in _sql_statements_of_every_operation(dialect)}

    assert used | STORE_QUERIES[dialect] <= set(queries), sorted(used - set(queries))
    assert all(text and not text.endswith(";") for text in queries.values())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_placeholder_of_a_dialect_query_is_bound_by_its_operation(dialect: str) -> None:
    queries = load_queries(dialect)
    for statement in _sql_statements_of_every_operation(dialect):
        placeholders = set(re.findall(PLACEHOLDER[dialect], queries[statement.name]))
        assert placeholders == set(statement.params), (dialect, statement.name)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_has_the_same_migrations_in_version_order(dialect: str) -> None:
    migrations = load_migrations(dialect)

    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert [m.name for m in migrations] == [m.name for m in load_migrations("sqlite")]
    assert all(m.statements for m in migrations)


def test_split_statements_drops_comments_and_splits_at_line_ending_semicolons() -> None:
    text = "-- a comment\nCREATE TABLE a (x int);\n\nCREATE TABLE b (\n  y text\n);\n"

    assert split_statements(text) == ("CREATE TABLE a (x int)", "CREATE TABLE b (\n  y text\n)")


# -- SQLite: the holder's process and its takeover -----------------------------------------
ACQUIRED_ROW = rows((7, 1_000), columns=("fence", "now_us"))
THE_GONE = rows(("host:9:secret", 6, 4_321, 77, 4_400), columns=HOLDER_COLUMNS)


def _acquire_params(me: LocalHolder | None) -> dict[str, object]:
    return {
        "namespace": "ns",
        "name": "job",
        "holder": "host:1:abc",
        "ttl_us": 1_000,
        "least_us": 500,
        "scope": None if me is None else me.scope,
        "pid": None if me is None else me.pid,
        "start": None if me is None else me.start,
        "group": None if me is None else me.group,
    }


def test_sqlite_acquire_records_this_process_as_the_holder() -> None:
    ops = SqliteOperations(GoneHolders())
    execute = FakeExecute(ACQUIRED_ROW)

    record = drive(ops.lease_acquire("ns", "job", "host:1:abc", 1_000, 500), execute)

    assert record == replace(RECORD, now_us=1_000)
    assert execute.statements == [Query("lease_acquire", _acquire_params(HERE))]


def test_sqlite_acquire_of_a_held_lease_whose_holder_is_gone_releases_it_and_takes_it() -> None:
    host = GoneHolders(gone=True)
    execute = FakeExecute(rows(), THE_GONE, rows((1,)), ACQUIRED_ROW)

    record = drive(
        SqliteOperations(host).lease_acquire("ns", "job", "host:1:abc", 1_000, 500), execute
    )

    assert record == replace(RECORD, now_us=1_000)
    assert host.asked == [LocalHolder(scope=HERE.scope, pid=4_321, start=77, group=4_400)]
    assert execute.statements == [
        Query("lease_acquire", _acquire_params(HERE)),
        Query("lease_holder", {"namespace": "ns", "name": "job", "scope": HERE.scope}),
        # Released as its holder would (lock_at_least kept), in the same transaction.
        Query(
            "lease_release",
            {"namespace": "ns", "name": "job", "holder": "host:9:secret", "fence": 6},
        ),
        Query("lease_acquire", _acquire_params(HERE)),
    ]


def test_sqlite_acquire_leaves_a_lease_whose_holder_lives_or_is_not_of_this_host() -> None:
    alive = GoneHolders(gone=False)
    execute = FakeExecute(rows(), THE_GONE)
    assert drive(SqliteOperations(alive).lease_acquire("ns", "job", "h", 1, 0), execute) is None
    assert execute.names == ["lease_acquire", "lease_holder"]
    assert len(alive.asked) == 1

    elsewhere = GoneHolders(gone=True)
    execute = FakeExecute(rows(), rows(columns=HOLDER_COLUMNS))  # no row of this host's
    assert drive(SqliteOperations(elsewhere).lease_acquire("ns", "job", "h", 1, 0), execute) is None
    assert execute.names == ["lease_acquire", "lease_holder"]
    assert elsewhere.asked == []

    # Released for it, but its lock_at_least still holds the lease: not taken.
    execute = FakeExecute(rows(), THE_GONE, rows((1,)), rows())
    assert (
        drive(SqliteOperations(GoneHolders()).lease_acquire("ns", "job", "h", 1, 0), execute)
        is None
    )
    assert execute.names == ["lease_acquire", "lease_holder", "lease_release", "lease_acquire"]


def test_sqlite_acquire_on_a_host_that_cannot_say_records_nothing_and_takes_nothing_over() -> None:
    nobody = GoneHolders(gone=True, me=None)
    execute = FakeExecute(rows())

    assert (
        drive(
            SqliteOperations(nobody).lease_acquire("ns", "job", "host:1:abc", 1_000, 500), execute
        )
        is None
    )
    assert execute.statements == [Query("lease_acquire", _acquire_params(None))]
    assert nobody.asked == []


@pytest.mark.parametrize(("result", "named"), [(rows((1,)), True), (rows(), False)])
def test_sqlite_lease_group_names_the_group_for_the_exact_holder_and_fence(
    result: SqlResult, named: bool
) -> None:
    execute = FakeExecute(result)

    assert (
        drive(SqliteOperations(GoneHolders()).lease_group("ns", "job", "h", 7, 0), execute) is named
    )
    assert execute.statements == [
        Query(
            "lease_group",
            {"namespace": "ns", "name": "job", "holder": "h", "fence": 7, "group": 0},
        )
    ]


# -- Redis operations ----------------------------------------------------------------------
REDIS = RedisOperations()
KEY = lease_key("ns", "job")


def test_redis_acquire_is_one_script_call_on_the_lease_key() -> None:
    execute = FakeExecute([7, 1_000])  # {fence, store now}: the rest follows from the terms

    record = drive(REDIS.lease_acquire("ns", "job", "host:1:abc", 1_000, 500), execute)

    assert record == replace(RECORD, now_us=1_000)
    assert execute.statements == [
        Script("lease_acquire", (KEY,), ("host:1:abc", 1_000, 500, "ns", "job"))
    ]


@pytest.mark.parametrize("reply", [None, False, 0])
def test_redis_acquire_and_extend_return_none_when_the_script_refuses(reply: object) -> None:
    assert drive(REDIS.lease_acquire("ns", "job", "h", 1, 0), FakeExecute(reply)) is None
    assert drive(REDIS.lease_extend("ns", "job", "h", 7, 1), FakeExecute(reply)) is None


def test_redis_extend_binds_holder_fence_and_length() -> None:
    execute = FakeExecute([b"job", b"host:1:abc", 7, 1000, 2000, 1500, 1200])

    record = drive(REDIS.lease_extend("ns", "job", "host:1:abc", 7, 9_000), execute)

    assert record == RECORD
    assert execute.statements == [Script("lease_extend", (KEY,), ("host:1:abc", 7, 9_000))]


@pytest.mark.parametrize(("reply", "released"), [(1, True), (0, False)])
def test_redis_release_reports_the_scripts_answer(reply: int, released: bool) -> None:
    execute = FakeExecute(reply)

    assert drive(REDIS.lease_release("ns", "job", "h", 7), execute) is released
    assert execute.statements == [Script("lease_release", (KEY,), ("h", 7))]


def test_redis_get_maps_the_stored_fields_or_none() -> None:
    reply = [b"job", b"host:1:abc", 7, 1000, 2000, 1500, 1200]
    execute = FakeExecute(reply, None)

    assert drive(REDIS.lease_get("ns", "job"), execute) == RECORD
    assert drive(REDIS.lease_get("ns", "job"), execute) is None
    assert execute.statements[0] == Script("lease_get", (KEY,), ())


def test_redis_list_scans_the_namespace_then_reads_every_key_in_one_batch() -> None:
    keys = [lease_key("ns", "zeta"), lease_key("ns", "alpha"), lease_key("ns", "gone")]
    execute = FakeExecute(
        keys,
        [
            [b"zeta", b"h1", 1, 1, 2, 1, 3],
            [b"alpha", b"h2", 2, 1, 2, 1, 3],
            None,  # deleted between SCAN and the read
        ],
    )

    listed = drive(REDIS.lease_list("ns"), execute)

    assert [r.name for r in listed] == ["alpha", "zeta"]
    assert [r.holder for r in listed] == ["h2", "h1"]
    assert execute.statements == [
        KeyScan(namespace_pattern("ns")),
        fan_out("lease_get", tuple(keys), ()),
    ]


@pytest.mark.parametrize(("dry_run", "flag"), [(True, 1), (False, 0)])
def test_redis_prune_scans_then_prunes_each_key_and_returns_sorted_names(
    dry_run: bool, flag: int
) -> None:
    keys = [lease_key("ns", "b"), lease_key("ns", "a"), lease_key("ns", "held")]
    execute = FakeExecute(keys, [b"b", b"a", False])

    assert drive(REDIS.lease_prune("ns", 5_000, dry_run), execute) == ["a", "b"]
    assert execute.statements[1] == fan_out("lease_prune", tuple(keys), (5_000, flag))


def test_every_redis_statement_is_a_script_or_a_scan() -> None:
    execute = FakeExecute(None, None, 0, None, [], [], [], [])
    drive(REDIS.lease_acquire("ns", "n", "h", 1, 0), execute)
    drive(REDIS.lease_extend("ns", "n", "h", 1, 1), execute)
    drive(REDIS.lease_release("ns", "n", "h", 1), execute)
    drive(REDIS.lease_get("ns", "n"), execute)
    drive(REDIS.lease_list("ns"), execute)
    drive(REDIS.lease_prune("ns", 1, False), execute)

    for name in execute.names:
        assert name == "scan" or name in SCRIPTS, name


def test_redis_keys_are_hash_tagged_and_unambiguous() -> None:
    assert lease_key("ns", "job") == "fleetcron:{2:ns:job}"
    assert lease_key("a", "b:c") != lease_key("a:b", "c")
    assert namespace_pattern("a*b?[c]") == "fleetcron:{7:a\\*b\\?\\[c\\]:*"


# -- the runners -----------------------------------------------------------------------
def _two_step() -> Any:
    first = yield Query("one")
    second = yield Query("two", {"previous": first})
    return (first, second)


def test_drive_feeds_each_result_back_and_returns_the_operations_value() -> None:
    execute = FakeExecute("a", "b")

    assert drive(_two_step(), execute) == ("a", "b")
    assert execute.statements == [Query("one"), Query("two", {"previous": "a"})]


async def test_drive_async_feeds_each_awaited_result_back() -> None:
    execute = FakeExecute("a", "b")

    async def run(statement: Statement) -> Any:
        return execute(statement)

    assert await drive_async(_two_step(), run) == ("a", "b")
    assert execute.names == ["one", "two"]


def test_a_failing_statement_propagates_and_closes_the_operation() -> None:
    operation = _two_step()

    def fail(statement: Statement) -> Any:
        raise RuntimeError(f"store failed on {getattr(statement, 'name', statement)}")

    with pytest.raises(RuntimeError, match="store failed on one"):
        drive(operation, fail)
    assert operation.gi_frame is None  # closed, not left suspended


def test_every_backend_implements_every_operation() -> None:
    from fleetcron.stores.base import Operations
    from fleetcron.stores.memory import MemoryOperations
    from fleetcron.stores.sql.mysql import MysqlOperations
    from fleetcron.stores.sql.postgres import PostgresOperations
    from fleetcron.stores.sql.sqlite_operations import SqliteOperations

    names = {
        name
        for name in dir(Operations)
        if not name.startswith("_") and callable(getattr(Operations, name))
    }
    assert {"lease_acquire", "run_claim", "job_list", "store_now"} <= names
    for ops in (
        MemoryOperations(),
        SqliteOperations(),
        PostgresOperations(),
        MysqlOperations(),
        RedisOperations(),
    ):
        assert isinstance(ops, Operations), type(ops).__name__
        missing = [name for name in names if not callable(getattr(ops, name, None))]
        assert not missing, (type(ops).__name__, missing)


def _due_row(job: str, slot: int) -> tuple[Any, ...]:
    return (
        job,
        slot,
        "queued",
        0,
        0,
        "",
        "",
        "manual",
        None,
        None,
        None,
        None,
        False,
        None,
        None,
        None,
        5_000,
    )


def runs(*found: tuple[Any, ...]) -> SqlResult:
    return rows(*found, columns=RUNS.columns)


def test_sql_run_due_names_the_jobs_only_when_a_full_page_holds_others() -> None:
    ledger = SqlLedger()
    # Not a full page: the namespace's rows, the others' dropped, no names sent.
    execute = FakeExecute(runs(_due_row("mine", 1), _due_row("other", 2)))
    due = drive(ledger.run_due("ns", 3, ["mine"]), execute)
    assert [(r.job, r.slot_us) for r in due] == [("mine", 1)]
    assert execute.statements == [Query("run_due", {"namespace": "ns", "limit": 3, "jobs": None})]
    # A full page of our own rows: the answer as it is.
    execute = FakeExecute(runs(_due_row("mine", 1), _due_row("mine", 2)))
    due = drive(ledger.run_due("ns", 2, ["mine"]), execute)
    assert [(r.job, r.slot_us) for r in due] == [("mine", 1), ("mine", 2)]
    assert len(execute.statements) == 1
    # A full page holding others' rows may hide ours: asked again with the names.
    execute = FakeExecute(
        runs(_due_row("other", 1), _due_row("mine", 2)),
        runs(_due_row("mine", 2), _due_row("mine", 3)),
    )
    due = drive(ledger.run_due("ns", 2, ["mine"]), execute)
    assert [(r.job, r.slot_us) for r in due] == [("mine", 2), ("mine", 3)]
    assert execute.statements[0] == Query("run_due", {"namespace": "ns", "limit": 2, "jobs": None})
    assert execute.statements[1] == Query(
        "run_due", {"namespace": "ns", "limit": 2, "jobs": '["mine"]'}
    )
    # No jobs named: one query, every row.
    execute = FakeExecute(runs(_due_row("other", 1)))
    assert [r.job for r in drive(ledger.run_due("ns", 2, None), execute)] == ["other"]
