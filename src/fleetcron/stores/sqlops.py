"""Lease operations for the SQL backends, and the loader of their ``.sql`` files.

The statements themselves live in ``sql/<dialect>/queries.sql`` as named blocks
(``-- name: lease_acquire``); this module only binds parameters and maps rows, so the
three dialects share one implementation of every operation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from fleetcron.models import LeaseRecord
from fleetcron.stores.base import Operation, SqlResult, Statement, rows_to_records

__all__ = ["Migration", "SqlOperations", "load_migrations", "load_queries", "split_statements"]

_NAME = re.compile(r"^--\s*name:\s*([a-z_]+)\s*$", re.MULTILINE)


def load_queries(dialect: str) -> dict[str, str]:
    """Read ``sql/<dialect>/queries.sql`` into ``{name: text}``."""
    text = resources.files("fleetcron.stores").joinpath("sql", dialect, "queries.sql").read_text()
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


@dataclass(frozen=True, slots=True)
class Migration:
    """One forward-only schema step, ``NNNN_name.sql``."""

    version: int
    name: str
    statements: tuple[str, ...]


def split_statements(text: str) -> tuple[str, ...]:
    """Split a migration file at lines ending with ``;`` (no procedural bodies are used)."""
    statements, current = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("--") or not line.strip():
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            statements.append("\n".join(current).rstrip().rstrip(";"))
            current = []
    if current:
        statements.append("\n".join(current))
    return tuple(statements)


def load_migrations(dialect: str) -> list[Migration]:
    """All migrations of ``dialect`` in version order."""
    folder = resources.files("fleetcron.stores").joinpath("sql", dialect, "migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append(
                Migration(
                    version=int(match.group(1)),
                    name=entry.name,
                    statements=split_statements(entry.read_text()),
                )
            )
    return sorted(found, key=lambda migration: migration.version)


class SqlOperations:
    """Lease operations as statement generators, shared by every SQL dialect.

    ``creates_rows``: the dialect's ``lease_acquire`` only updates an existing row, reads
    the row back whoever holds it and reports the UPDATE's matched count (MySQL, which has
    no ``RETURNING``); a missing row is made with ``lease_create`` and the acquire tried
    once more. Otherwise ``lease_acquire`` returns a row only when it took the lease.
    """

    def __init__(self, *, creates_rows: bool = False) -> None:
        self.creates_rows = creates_rows

    def lease_acquire(
        self, namespace: str, name: str, holder: str, ttl_us: int, least_us: int
    ) -> Operation[LeaseRecord | None]:
        params = {
            "namespace": namespace,
            "name": name,
            "holder": holder,
            "ttl_us": ttl_us,
            "least_us": least_us,
        }
        result: SqlResult = yield Statement("lease_acquire", params)
        if not result.rows and self.creates_rows:
            yield Statement("lease_create", {"namespace": namespace, "name": name})
            result = yield Statement("lease_acquire", params)
        # Taken only if the statement changed the row (MySQL reads the row back whoever
        # holds it; a matched count of 0 means it was held). The row is (fence, store now);
        # the rest follows from the terms, so nothing more crosses the wire.
        if not result.rows or result.rowcount == 0:
            return None
        fence, now = (int(value) for value in result.rows[0][:2])
        return LeaseRecord(
            namespace=namespace,
            name=name,
            holder=holder,
            fence=fence,
            acquired_us=now,
            expires_us=now + ttl_us,
            min_until_us=now + least_us,
            now_us=now,
        )

    def lease_extend(
        self, namespace: str, name: str, holder: str, fence: int, ttl_us: int
    ) -> Operation[LeaseRecord | None]:
        result: SqlResult = yield Statement(
            "lease_extend",
            {
                "namespace": namespace,
                "name": name,
                "holder": holder,
                "fence": fence,
                "ttl_us": ttl_us,
            },
        )
        records = rows_to_records(namespace, result.rows)
        # MySQL's SELECT finds the row even when the UPDATE matched nothing: its matched
        # count (0) decides. PostgreSQL and SQLite return rows only for a match (SQLite may
        # report -1, "unknown", for a statement that starts with WITH).
        return records[0] if records and result.rowcount != 0 else None

    def lease_release(self, namespace: str, name: str, holder: str, fence: int) -> Operation[bool]:
        result: SqlResult = yield Statement(
            "lease_release",
            {"namespace": namespace, "name": name, "holder": holder, "fence": fence},
        )
        return bool(result.rows) or result.rowcount > 0

    def lease_get(self, namespace: str, name: str) -> Operation[LeaseRecord | None]:
        result: SqlResult = yield Statement("lease_get", {"namespace": namespace, "name": name})
        records = rows_to_records(namespace, result.rows)
        return records[0] if records else None

    def lease_list(self, namespace: str) -> Operation[list[LeaseRecord]]:
        result: SqlResult = yield Statement("lease_list", {"namespace": namespace})
        return rows_to_records(namespace, result.rows)

    def lease_prune(
        self, namespace: str, older_than_us: int, dry_run: bool
    ) -> Operation[list[str]]:
        params = {"namespace": namespace, "older_than_us": older_than_us}
        result: SqlResult = yield Statement(
            "lease_prune_preview" if dry_run else "lease_prune", params
        )
        return sorted(_decode(row[0]) for row in result.rows)


def _decode(value: object) -> str:
    return bytes(value).decode("utf-8") if isinstance(value, bytes | bytearray) else str(value)
