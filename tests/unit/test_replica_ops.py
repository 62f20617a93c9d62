"""The replica-heartbeat operations driven without a store: each one is a single statement
(one round trip), binds what it is given, and maps the row back. The statements themselves
run against every real backend in ``tests/contract/test_replicas.py``."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from fleetcron.models import ReplicaInfo, ReplicaRecord
from fleetcron.stores.base import REPLICA_PRUNE_LIMIT, drive
from fleetcron.stores.redis.keys import jobs_pattern, replica_index_key, replica_key
from fleetcron.stores.redis.operations import RedisOperations
from fleetcron.stores.redis.scripts import SCRIPTS
from fleetcron.stores.redis.statements import Script
from fleetcron.stores.rows import REPLICAS
from fleetcron.stores.sql.files import load_queries
from fleetcron.stores.sql.operations import SqlLedger
from fleetcron.stores.sql.sqlite_operations import SqliteOperations
from fleetcron.stores.sql.statements import Query, SqlResult
from unit.fakes import FakeExecute

INFO = ReplicaInfo(
    replica_id="host:42:0a1b2c3d",
    host="host",
    pid=42,
    version="1.0",
    mode="claim",
    jobs_fingerprint="f" * 32,
)
ROW = (b"host:42:0a1b2c3d", b"host", 42, b"1.0", b"claim", b"f" * 32, 100, 200, 300, 250)
RECORD = ReplicaRecord(
    namespace="ns",
    replica_id="host:42:0a1b2c3d",
    host="host",
    pid=42,
    version="1.0",
    mode="claim",
    jobs_fingerprint="f" * 32,
    started_us=100,
    last_seen_us=200,
    expires_us=300,
    now_us=250,
)
BEAT_PARAMS = {
    "namespace": "ns",
    "replica_id": "host:42:0a1b2c3d",
    "host": "host",
    "pid": 42,
    "version": "1.0",
    "mode": "claim",
    "jobs_fingerprint": "f" * 32,
    "ttl_us": 30,
    "retain_us": 60,
    "prune_limit": REPLICA_PRUNE_LIMIT,
}


def result(
    *rows: tuple[object, ...],
    columns: tuple[str, ...] = REPLICAS.columns,  # as the statements name them
    rowcount: int | None = None,
) -> SqlResult:
    count = len(rows) if rowcount is None else rowcount
    return SqlResult(rows=list(rows), rowcount=count, columns=columns)


def test_a_sql_beat_is_one_statement_binding_every_field() -> None:
    execute = FakeExecute(result(ROW))

    assert drive(SqlLedger().replica_beat("ns", INFO, 30, 60), execute) == RECORD
    assert execute.statements == [Query("replica_beat", BEAT_PARAMS)]


def test_a_sqlite_beat_prunes_and_upserts_at_one_clock_reading_in_one_transaction() -> None:
    execute = FakeExecute(result((777,), columns=("now_us",)), result(), result(ROW))

    assert drive(SqliteOperations().replica_beat("ns", INFO, 30, 60), execute) == RECORD
    assert execute.names == ["store_now", "replica_prune", "replica_put"]
    assert execute.statements[1] == Query("replica_prune", {**BEAT_PARAMS, "now": 777})
    assert execute.statements[2] == Query("replica_put", {**BEAT_PARAMS, "now": 777})


def test_sql_list_and_leave_are_one_statement_each() -> None:
    execute = FakeExecute(result(ROW), result(rowcount=1), result(rowcount=0))
    ops = SqlLedger()

    assert drive(ops.replica_list("ns", 5), execute) == [RECORD]
    assert drive(ops.replica_leave("ns", "host:42:0a1b2c3d"), execute) is True
    assert drive(ops.replica_leave("ns", "gone"), execute) is False
    assert execute.statements[0] == Query("replica_list", {"namespace": "ns", "gone_within_us": 5})
    assert execute.names == ["replica_list", "replica_leave", "replica_leave"]


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_every_dialect_has_the_replica_queries(dialect: str) -> None:
    queries = load_queries(dialect)
    needed = {"replica_list", "replica_leave"}
    needed |= {"replica_prune", "replica_put"} if dialect == "sqlite" else {"replica_beat"}

    assert needed <= set(queries)


def test_a_redis_beat_is_one_script_on_keys_of_one_cluster_slot() -> None:
    execute = FakeExecute(list(ROW))

    assert drive(RedisOperations().replica_beat("ns", INFO, 30, 60), execute) == RECORD
    (statement,) = execute.statements
    assert statement == Script(
        "replica_beat",
        (replica_index_key("ns"), replica_key("ns", "host:42:0a1b2c3d")),
        ("host:42:0a1b2c3d", "host", 42, "1.0", "claim", "f" * 32, 30, 60, REPLICA_PRUNE_LIMIT),
    )
    assert statement.name in SCRIPTS


def test_redis_lists_replicas_by_id_and_leaves_with_one_script_each() -> None:
    other = [b"a:1:x", b"a", 1, b"1.0", b"leader", b"e" * 32, 1, 2, 3, 250]
    execute = FakeExecute([list(ROW), other], 1)
    ops = RedisOperations()

    listed = drive(ops.replica_list("ns", 5), execute)
    assert [r.replica_id for r in listed] == ["a:1:x", "host:42:0a1b2c3d"]
    assert drive(ops.replica_leave("ns", "a:1:x"), execute) is True
    assert execute.statements == [
        Script("replica_list", (replica_index_key("ns"),), (5,)),
        Script("replica_leave", (replica_index_key("ns"), replica_key("ns", "a:1:x")), ("a:1:x",)),
    ]


@pytest.mark.parametrize(
    ("namespace", "replica_id"), [("ns", "h:1:ab"), ("a:b", "c}d"), ("☃", "é")]
)
def test_a_namespaces_replica_keys_share_one_hash_tag_and_are_no_lease_or_job_key(
    namespace: str, replica_id: str
) -> None:
    index, row = replica_index_key(namespace), replica_key(namespace, replica_id)

    assert key_slot(index.encode()) == key_slot(row.encode())
    assert index.endswith(":index")
    assert row.startswith(index.removesuffix(":index"))
    assert not index.endswith("}")
    assert not jobs_pattern(namespace).endswith(":index")
    assert replica_index_key(namespace) != replica_index_key(f"{namespace}-other")
