"""``job_page``: the job rows of a namespace read a page at a time, on every backend.

A reader of every job of a large namespace (the retention pass's orphan report, a standby
following the leader, the CLI) holds one page of rows at a time, and without the
definitions when it reads only progress or signs of life.
"""

from __future__ import annotations

import dataclasses

from fleetcron.models import JobRecord
from fleetcron.stores import SyncStore

NAMES = ["🔒 lock", "alpha", "Zulu", "naïve ☃", "a", "a-b", "a.b", "b", "ab", "Ω"]


def register(store: SyncStore, namespace: str, names: list[str]) -> None:
    jobs = [(name, f'{{"name": "{name}"}}', f"fp-{name}") for name in names]
    assert store.run(store.ops.job_register(namespace, jobs)) == [None] * len(names)


def pages(
    store: SyncStore, namespace: str, limit: int, *, definitions: bool = True
) -> list[list[JobRecord]]:
    read, after = [], ""
    while True:
        page = store.run(store.ops.job_page(namespace, after, limit, definitions=definitions))
        assert len(page) <= limit
        read.append(page)
        if len(page) < limit:
            return read
        after = page[-1].job


def stored(row: JobRecord) -> JobRecord:
    return dataclasses.replace(row, now_us=0)


def is_postgres(store: SyncStore) -> bool:
    return store.url.startswith(("postgresql:", "postgres:"))


def test_pages_meet_every_job_row_once_as_job_list_has_them(
    store: SyncStore, namespace: str
) -> None:
    register(store, namespace, NAMES)
    register(store, f"{namespace}-other", ["elsewhere"])
    listed = store.run(store.ops.job_list(namespace))

    for limit in (1, 3, 10, 11, 1000):
        read = pages(store, namespace, limit)
        rows = [row for page in read for row in page]
        assert len(read[-1]) < limit, "the last page is short (an empty one if need be)"
        assert {row.job: stored(row) for row in rows} == {row.job: stored(row) for row in listed}
        assert len({row.job for row in rows}) == len(NAMES)
        assert all(row.namespace == namespace for row in rows)
        assert all(row.now_us > 0 for row in rows)
        if not is_postgres(store):  # PostgreSQL: the database's collation (see the protocol)
            assert [row.job for row in rows] == sorted(NAMES)


def test_without_definitions_a_page_holds_everything_but_the_definition(
    store: SyncStore, namespace: str
) -> None:
    register(store, namespace, NAMES)
    assert store.run(store.ops.job_set_paused(namespace, "alpha", True))
    full = {row.job: row for row in store.run(store.ops.job_list(namespace))}

    (brief,) = pages(store, namespace, 100, definitions=False)

    assert {row.job for row in brief} == set(NAMES)
    for row in brief:
        assert row.definition == ""
        assert stored(row) == stored(dataclasses.replace(full[row.job], definition=""))
    assert next(row for row in brief if row.job == "alpha").paused


def test_a_page_starts_after_the_name_given_and_is_empty_past_the_last(
    store: SyncStore, namespace: str
) -> None:
    register(store, namespace, ["j1", "j2", "j3"])
    ops = store.ops

    assert [row.job for row in store.run(ops.job_page(namespace, "j1", 10))] == ["j2", "j3"]
    assert [row.job for row in store.run(ops.job_page(namespace, "j10", 10))] == ["j2", "j3"]
    assert store.run(ops.job_page(namespace, "j3", 10)) == []
    assert store.run(ops.job_page(namespace, "", 0)) == []
    assert store.run(ops.job_page(f"{namespace}-empty", "", 10)) == []


def test_a_job_registered_while_reading_is_met_when_its_name_is_still_ahead(
    store: SyncStore, namespace: str
) -> None:
    register(store, namespace, ["b1", "b2", "b3", "b4"])
    ops = store.ops
    first = store.run(ops.job_page(namespace, "", 2))
    assert [row.job for row in first] == ["b1", "b2"]

    register(store, namespace, ["a0", "b9"])  # one behind the cursor, one ahead
    assert store.run(ops.job_delete(namespace, "b3"))
    rest = store.run(ops.job_page(namespace, first[-1].job, 10))

    assert [row.job for row in rest] == ["b4", "b9"]
