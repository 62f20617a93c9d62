"""Checkpoints on the SQL backends: what only they can get wrong.

``test_checkpoints.py`` is the contract every backend keeps. This file checks what the SQL
implementation (``stores/sql/checkpoints.py`` and the dialects' ``queries.sql``) could get
wrong beyond it: a refused set that would write the same value (MySQL counts it as a
match, like an insert), a value of the full 64 KiB with every kind of character, names
compared byte for byte, sets racing on one row (a new one included) from many
connections, the async runners, and each operation being one named query with every
placeholder bound.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pymysql
import pytest

from fleetcron.checkpoint import MAX_CHECKPOINT_BYTES
from fleetcron.stores import SyncStore, open_async_store, open_store, parse_store_url
from fleetcron.stores.base import Operation, drive
from fleetcron.stores.sql.checkpoints import SqlCheckpoints
from fleetcron.stores.sql.files import load_queries
from fleetcron.stores.sql.mysql import resendable
from fleetcron.stores.sql.statements import Query, SqlResult
from fleetcron.stores.statements import Statement

EVERY = pytest.mark.parametrize(
    "backend_url", ["memory", "sqlite", "postgres", "mysql"], indirect=True
)
SQL = pytest.mark.parametrize("backend_url", ["sqlite", "postgres", "mysql"], indirect=True)
MYSQL = pytest.mark.parametrize("backend_url", ["mysql"], indirect=True)
DIALECTS = ("sqlite", "postgres", "mysql")
PLACEHOLDER = {
    "sqlite": r":([a-z_]+)\b",
    "postgres": r"%\(([a-z_]+)\)s",
    "mysql": r"%\(([a-z_]+)\)s",
}


def wait_past(store: SyncStore, stamp_us: int) -> None:
    """Until the store's clock is past ``stamp_us`` (SQLite's ticks by the millisecond), so
    a write now would show in ``updated_us``."""
    give_up = time.monotonic() + 10
    while store.run(store.ops.store_now()) <= stamp_us:
        assert time.monotonic() < give_up, "the store clock did not move"
        time.sleep(0.002)


# -- the answer is whether the row moved, never a count -----------------------------------------


@EVERY
def test_a_refused_set_changes_nothing_even_when_it_would_write_the_same_value(
    store: SyncStore, namespace: str
) -> None:
    ops = store.ops
    assert store.run(ops.checkpoint_set(namespace, "cp", 12, "3"))
    first = store.run(ops.checkpoint_get(namespace, "cp"))
    assert first is not None
    wait_past(store, first.updated_us)

    # The same value under a lower fence: refused, though the row would look the same.
    assert store.run(ops.checkpoint_set(namespace, "cp", 11, "3")) is False
    after = store.run(ops.checkpoint_get(namespace, "cp"))
    assert after is not None
    assert (after.value, after.fence, after.updated_us) == ("3", 12, first.updated_us)

    # The same value under the same fence: a set (the same run again), at a new time.
    assert store.run(ops.checkpoint_set(namespace, "cp", 12, "3")) is True
    again = store.run(ops.checkpoint_get(namespace, "cp"))
    assert again is not None
    assert (again.value, again.fence) == ("3", 12)
    assert again.updated_us > first.updated_us


@EVERY
def test_fence_zero_sets_an_unset_checkpoint_and_a_huge_fence_round_trips(
    store: SyncStore, namespace: str
) -> None:
    ops = store.ops
    assert store.run(ops.checkpoint_set(namespace, "cp", 0, "null"))
    assert store.run(ops.checkpoint_set(namespace, "cp", 2**62, '""'))
    assert store.run(ops.checkpoint_set(namespace, "cp", 2**62 - 1, "1")) is False
    got = store.run(ops.checkpoint_get(namespace, "cp"))
    assert got is not None
    assert (got.value, got.fence) == ('""', 2**62)


# -- values and names, byte for byte ------------------------------------------------------------


def _json_of_exactly(size: int) -> str:
    """A JSON text of exactly ``size`` UTF-8 bytes holding quotes, backslashes, percent
    signs (the drivers' placeholders), 2-, 3- and 4-byte characters and a NUL escape."""
    body = "naïve 'q' \"dq\" \\ %s %(value)s :name €uro 🎉\u0000 "
    text = json.dumps({"mark": body * 600, "pad": ""}, ensure_ascii=False)
    missing = size - len(text.encode("utf-8"))
    assert missing >= 0
    text = json.dumps({"mark": body * 600, "pad": "x" * missing}, ensure_ascii=False)
    assert len(text.encode("utf-8")) == size
    return text


@SQL
def test_a_value_of_the_full_64_kib_comes_back_byte_for_byte(
    store: SyncStore, namespace: str
) -> None:
    ops = store.ops
    big = _json_of_exactly(MAX_CHECKPOINT_BYTES)
    assert store.run(ops.checkpoint_set(namespace, "big", 5, big))
    got = store.run(ops.checkpoint_get(namespace, "big"))
    assert got is not None
    assert got.value == big
    # Overwritten by another of the same size (the upsert's update path).
    other = big.replace("🎉", "🎊")
    assert store.run(ops.checkpoint_set(namespace, "big", 6, other))
    got = store.run(ops.checkpoint_get(namespace, "big"))
    assert got is not None
    assert (got.value, got.fence) == (other, 6)


@EVERY
def test_names_and_namespaces_are_compared_byte_for_byte(store: SyncStore, namespace: str) -> None:
    ops = store.ops
    names = ["job", "Job", "job ", "jöb", "jo\u0308b", "job/🎉", "a" * 200]
    for fence, name in enumerate(names, start=1):
        assert store.run(ops.checkpoint_set(namespace, name, fence, json.dumps(name)))
    assert store.run(ops.checkpoint_set(namespace + " ", "job", 99, '"spaced"'))

    for fence, name in enumerate(names, start=1):
        got = store.run(ops.checkpoint_get(namespace, name))
        assert got is not None
        assert (got.namespace, got.name, got.value, got.fence) == (
            namespace,
            name,
            json.dumps(name),
            fence,
        )
    spaced = store.run(ops.checkpoint_get(namespace + " ", "job"))
    assert spaced is not None
    assert (spaced.value, spaced.fence) == ('"spaced"', 99)


# -- sets racing from many connections ----------------------------------------------------------


@SQL
def test_sets_racing_on_one_row_leave_the_highest_fence_and_its_value(
    backend_url: str, namespace: str, store: SyncStore
) -> None:
    """Six connections set the same checkpoints at once, each under its own fences: a new
    name's first sets race on the insert. None fails, the highest fence always wins, and a
    set is refused only when a higher fence got there first."""
    workers, per_worker, rounds = 6, 8, 3
    stores = [open_store(parse_store_url(backend_url)) for _ in range(workers)]
    answers: list[list[tuple[str, int, bool]]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []
    start = threading.Barrier(workers)

    def work(me: int) -> None:
        try:
            start.wait(timeout=30)
            for r in range(rounds):
                # Interleaved fences: every worker keeps meeting the others' higher ones.
                for step in range(per_worker):
                    fence = 1 + step * workers + me
                    name = f"race-{r}"
                    done = stores[me].run(
                        stores[me].ops.checkpoint_set(namespace, name, fence, str(fence))
                    )
                    answers[me].append((name, fence, done))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(me,)) for me in range(workers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
            assert not thread.is_alive(), "a set hung"
    finally:
        for opened in stores:
            opened.close()
    assert not errors, errors

    top = workers * per_worker
    for r in range(rounds):
        got = store.run(store.ops.checkpoint_get(namespace, f"race-{r}"))
        assert got is not None
        assert (got.value, got.fence) == (str(top), top)
    every = [answer for mine in answers for answer in mine]
    assert len(every) == workers * per_worker * rounds
    assert all(done for _, fence, done in every if fence == top), "the highest fence lost"
    # Each worker's own fences increase: once one of its sets was refused, a higher fence
    # was stored, so every later refusal of it is under a fence below that one's.
    for mine in answers:
        for name in {n for n, _, _ in mine}:
            refused = [fence for n, fence, done in mine if n == name and not done]
            assert refused == sorted(refused)


# -- the async runners --------------------------------------------------------------------------


@SQL
async def test_the_async_runners_carry_the_checkpoint_operations(
    backend_url: str, namespace: str
) -> None:
    store = await open_async_store(parse_store_url(backend_url))
    try:
        ops = store.ops
        assert await store.run(ops.checkpoint_get(namespace, "cp")) is None
        assert await store.run(ops.checkpoint_set(namespace, "cp", 3, '{"id":1}')) is True
        assert await store.run(ops.checkpoint_set(namespace, "cp", 2, '{"id":0}')) is False
        got = await store.run(ops.checkpoint_get(namespace, "cp"))
        assert got is not None
        assert (got.value, got.fence) == ('{"id":1}', 3)
        assert got.updated_us <= got.now_us
    finally:
        await store.close()


# -- MySQL: the session keeps nothing of a value ------------------------------------------------


@MYSQL
def test_mysql_clears_the_value_it_sent_into_a_session_variable(
    store: SyncStore, namespace: str
) -> None:
    assert store.run(store.ops.checkpoint_set(namespace, "cp", 1, '"a value"'))
    result = store.execute_text("SELECT @fc_value, @fc_now IS NOT NULL")  # type: ignore[attr-defined]
    assert result.rows[0][0] is None
    assert result.rows[0][1]  # the same connection, which did run the block


# -- each operation is one named query, every placeholder bound (no database) -------------------


def _statements(operation: Operation[object], answer: SqlResult) -> list[Statement]:
    seen: list[Statement] = []

    def execute(statement: Statement) -> SqlResult:
        seen.append(statement)
        return answer

    drive(operation, execute)
    return seen


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_operation_is_one_query_of_the_dialect_binding_every_placeholder(
    dialect: str,
) -> None:
    queries = load_queries(dialect)
    ops = SqlCheckpoints()
    operations: list[Operation[object]] = [
        ops.checkpoint_get("ns", "n"),
        ops.checkpoint_set("ns", "n", 3, "{}"),
    ]
    for operation in operations:
        (statement,) = _statements(operation, SqlResult(rows=[], rowcount=0))
        assert isinstance(statement, Query)
        placeholders = set(re.findall(PLACEHOLDER[dialect], queries[statement.name]))
        assert placeholders == set(statement.params), (dialect, statement.name)
    if dialect == "mysql":
        # One transaction, so a deadlock's victim is sent again whole.
        deadlock = pymysql.err.OperationalError(1213, "deadlock")
        assert resendable(deadlock, queries["checkpoint_set"])


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        (SqlResult(rows=[(True,)], rowcount=1), True),  # PostgreSQL/SQLite: a row written
        (SqlResult(rows=[], rowcount=-1), False),  # PostgreSQL/SQLite: refused
        (SqlResult(rows=[(1,)], rowcount=1), True),  # MySQL: the row has the given fence
        (SqlResult(rows=[(0,)], rowcount=1), False),  # MySQL: refused, though it counted 1
    ],
)
def test_set_answers_from_the_row_never_from_the_count(result: SqlResult, answer: bool) -> None:
    assert drive(SqlCheckpoints().checkpoint_set("ns", "n", 3, "{}"), lambda _: result) is answer


def test_get_maps_the_row_and_decodes_binary_text() -> None:
    row = ('{"a":"é"}'.encode(), 7, 100, 120)
    columns = ("value", "fence", "updated_us", "now_us")  # as checkpoint_get names them
    got = drive(
        SqlCheckpoints().checkpoint_get("ns", "n"),
        lambda _: SqlResult(rows=[row], rowcount=1, columns=columns),
    )
    assert got is not None
    assert (got.namespace, got.name, got.value, got.fence, got.updated_us, got.now_us) == (
        "ns",
        "n",
        '{"a":"é"}',
        7,
        100,
        120,
    )
    none = drive(SqlCheckpoints().checkpoint_get("ns", "n"), lambda _: SqlResult([], 0))
    assert none is None
