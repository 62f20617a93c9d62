"""The SQL stores' statements and answers: a named query of the dialect's
``queries.sql``, once or once per parameter set in one round trip."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetcron.stores.statements import Statement

__all__ = ["Query", "QueryBatch", "SqlResult"]


@dataclass(frozen=True, slots=True)
class Query(Statement):
    """Run the named query of the dialect's ``queries.sql`` with ``params``."""

    name: str
    params: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueryBatch(Statement):
    """Run the named query once per parameter set, all in one round trip (PostgreSQL
    pipeline, MySQL multi-statement text); each execution yields exactly one result set."""

    name: str
    batch: tuple[Mapping[str, object], ...]


@dataclass(frozen=True, slots=True)
class SqlResult:
    """Rows returned by a statement (empty when it returns none), rows it matched, and the
    names of the returned columns, in the rows' order (as the driver describes the
    result). Records are read from the rows by those names (:mod:`fleetcron.stores.rows`)."""

    rows: list[tuple[Any, ...]]
    rowcount: int
    columns: tuple[str, ...] = ()
