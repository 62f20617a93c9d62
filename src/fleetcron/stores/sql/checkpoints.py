"""Checkpoints of the SQL backends (:class:`~fleetcron.stores.base.CheckpointOperations`),
shared by the three dialects.

Each operation is one named query of ``<dialect>/queries.sql``: one statement
(PostgreSQL, SQLite) or one multi-statement transaction (MySQL), so one round trip and
one atomic step, at the store's clock. The rule of the reference
(:mod:`fleetcron.stores.memory_queue`) — a checkpoint moves only when it is unset or its
fence is at most the given one — is the SQL's; this module binds parameters and maps the
answers.
"""

from __future__ import annotations

from fleetcron.queue_models import CheckpointRecord
from fleetcron.stores.base import Operation
from fleetcron.stores.rows import CHECKPOINTS
from fleetcron.stores.sql.statements import Query, SqlResult

__all__ = ["SqlCheckpoints"]


class SqlCheckpoints:
    """The checkpoint operations of the SQL dialects, each one named query."""

    def checkpoint_get(self, namespace: str, name: str) -> Operation[CheckpointRecord | None]:
        result: SqlResult = yield Query("checkpoint_get", {"namespace": namespace, "name": name})
        # (value, fence, updated_us, now_us); the key is what was asked for.
        return CHECKPOINTS.first(result, namespace, name)

    def checkpoint_set(self, namespace: str, name: str, fence: int, value: str) -> Operation[bool]:
        result: SqlResult = yield Query(
            "checkpoint_set",
            {"namespace": namespace, "name": name, "fence": fence, "value": value},
        )
        # Every dialect answers with a row that says whether the set happened: PostgreSQL
        # and SQLite return one only for a row written (none when a higher fence refused
        # it); MySQL always reads the row back and answers a truth value. Never the
        # statement's count, which SQLite may report as -1 and MySQL's CLIENT_FOUND_ROWS
        # makes 1 for a refused set as for an insert.
        return bool(result.rows and result.rows[0][0])
