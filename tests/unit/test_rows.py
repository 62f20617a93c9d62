"""The decoders of store answers: every record is read from its columns by name, whatever
their order or the other columns of the answer; a column missing or named twice is an
error naming the record and the column; the Redis scripts' replies are read by the names
their headers declare."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleetcron.errors import SchemaError
from fleetcron.stores.blocks import Block
from fleetcron.stores.redis.scripts import REPLY_ROWS, _reply_rows
from fleetcron.stores.rows import (
    ACQUIRED,
    CHECKPOINTS,
    ITEMS,
    JOBS,
    LEASES,
    REPLICAS,
    RUNS,
    STATS,
    RowDecoder,
)
from fleetcron.stores.sql.statements import SqlResult

# Each decoder with the context its caller gives, and the record field of each column.
DECODERS: list[tuple[RowDecoder[Any], tuple[Any, ...]]] = [
    (LEASES, ("ns",)),
    (RUNS, ("ns",)),
    (JOBS, ("ns",)),
    (REPLICAS, ("ns",)),
    (ITEMS, ("ns", "queue")),
    (STATS, ("ns",)),
    (CHECKPOINTS, ("ns", "name")),
]
FIELD = {"id": "item_id"}


def sentinels(decoder: RowDecoder[Any]) -> dict[str, int]:
    """A distinct number per column (every decoder reads a number as text, int or bool)."""
    return {column: 1_000 + index for index, column in enumerate(decoder.columns)}


def answer(values: dict[str, Any], order: list[str]) -> SqlResult:
    return SqlResult(rows=[tuple(values[c] for c in order)], rowcount=1, columns=tuple(order))


@pytest.mark.parametrize(("decoder", "context"), DECODERS, ids=lambda d: getattr(d, "record", ""))
def test_every_field_is_read_from_the_column_of_its_name_in_any_order(
    decoder: RowDecoder[Any], context: tuple[Any, ...]
) -> None:
    values = sentinels(decoder)
    in_order = decoder.first(answer(values, list(decoder.columns)), *context)
    shuffled = list(decoder.columns)
    random.Random(7).shuffle(shuffled)
    assert shuffled != list(decoder.columns)
    # More columns than the record needs: a claim's status, a batch item's position.
    wider = ["ord", *shuffled, "status"]
    values_wider = {**values, "ord": 1, "status": "claimed"}

    assert decoder.first(answer(values, shuffled), *context) == in_order
    assert decoder.first(answer(values_wider, wider), *context) == in_order
    for column, value in values.items():
        field = getattr(in_order, FIELD.get(column, column))
        assert field in (value, str(value), True), (decoder.record, column, field)


def test_a_function_result_column_is_read_without_its_r_prefix() -> None:
    values = sentinels(RUNS)
    plain = RUNS.first(answer(values, list(RUNS.columns)), "ns")
    prefixed = {f"r_{column}": value for column, value in values.items()}

    assert RUNS.first(answer(prefixed, list(prefixed)), "ns") == plain


def test_the_acquired_lease_is_its_fence_and_the_clock_with_the_terms() -> None:
    result = SqlResult(rows=[(7, 1_000)], rowcount=1, columns=("r_now_us", "r_fence"))

    lease = ACQUIRED.first(result, "ns", "job", "h", 500, 100)

    assert lease is not None
    assert (lease.fence, lease.now_us) == (1_000, 7)
    assert (lease.acquired_us, lease.expires_us, lease.min_until_us) == (7, 507, 107)


def test_a_missing_column_is_an_error_naming_the_record_and_the_column() -> None:
    values = sentinels(RUNS)
    columns = [c for c in RUNS.columns if c != "slot_us"]

    with pytest.raises(SchemaError, match=r"^run rows need the column 'slot_us'") as error:
        RUNS.all(answer(values, columns), "ns")
    assert "its columns: job, state," in error.value.message


def test_a_misspelt_column_is_an_error_naming_the_record_and_the_column() -> None:
    values = {("now" if c == "now_us" else c): v for c, v in sentinels(CHECKPOINTS).items()}

    with pytest.raises(SchemaError, match=r"^checkpoint rows need the column 'now_us'"):
        CHECKPOINTS.all(answer(values, list(values)), "ns", "name")


def test_a_column_named_twice_is_an_error() -> None:
    values = sentinels(LEASES)
    result = SqlResult(
        rows=[(*values.values(), 9)], rowcount=1, columns=(*LEASES.columns, "r_fence")
    )

    with pytest.raises(SchemaError, match="names the column 'fence' of lease rows twice"):
        LEASES.all(result, "ns")


def test_rows_without_column_names_are_an_error_too() -> None:
    nameless = SqlResult(rows=[tuple(sentinels(JOBS).values())], rowcount=1)

    with pytest.raises(SchemaError, match=r"^job rows need the column 'job'.*its columns: none"):
        JOBS.first(nameless, "ns")


def test_an_answer_without_rows_is_no_records_whatever_its_columns() -> None:
    empty = SqlResult(rows=[], rowcount=0)

    assert RUNS.all(empty, "ns") == []
    assert RUNS.first(empty, "ns") is None


def test_the_positions_are_resolved_once_per_tuple_of_column_names() -> None:
    decoder = RowDecoder("pair", ("a", "b"), lambda values: [tuple(v) for v in values])
    first = SqlResult(rows=[(1, 2, 3)], rowcount=1, columns=("b", "x", "a"))
    again = SqlResult(rows=[(4, 5, 6)], rowcount=1, columns=("b", "x", "a"))
    as_is = SqlResult(rows=[(7, 8)], rowcount=1, columns=("a", "b"))

    assert decoder.all(first) == [(3, 1)]
    assert decoder.all(again) == [(6, 4)]
    assert decoder.all(as_is) == [(7, 8)]
    assert len(decoder._readers) == 2
    assert decoder._readers[("a", "b")] is None, "the record's own columns: read as it is"


# -- the Redis replies -----------------------------------------------------------------
REPLIES: dict[str, RowDecoder[Any]] = {
    "acquired": ACQUIRED,
    "lease": LEASES,
    "run": RUNS,
    "job": JOBS,
    "replica": REPLICAS,
    "item": ITEMS,
    "checkpoint": CHECKPOINTS,
}


def test_every_declared_reply_layout_holds_its_records_columns() -> None:
    assert set(REPLY_ROWS) == {*REPLIES, "stats"}
    for name, decoder in REPLIES.items():
        assert set(decoder.columns) <= set(REPLY_ROWS[name]), name
    assert set(STATS.columns) <= {"queue", *REPLY_ROWS["stats"]}


def test_a_layout_is_read_from_a_scripts_header_over_several_comment_lines() -> None:
    block = Block(
        "x",
        "-- returns a pair:\n-- row pair: {left,\n--            right}\nreturn {1, 2}",
        (),
    )

    assert _reply_rows({"x": block}) == {"pair": ("left", "right")}


def test_two_scripts_declaring_one_layout_differently_are_refused() -> None:
    one = Block("one", "-- row pair: {left, right}", ())
    other = Block("other", "-- row pair: {right, left}", ())

    with pytest.raises(RuntimeError, match="declares row pair"):
        _reply_rows({"one": one, "other": other})
