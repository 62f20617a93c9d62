"""The files of a SQL dialect beside this module: ``<dialect>/queries.sql`` (one named
block per statement), ``<dialect>/migrations/NNNN_name.sql`` (forward-only schema steps)
and ``<dialect>/schema.sql`` (the schema the migrations build, to read in one place)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from fleetcron.stores.blocks import load_blocks

__all__ = ["Migration", "load_migrations", "load_queries", "load_schema", "split_statements"]

_PACKAGE = "fleetcron.stores.sql"


def load_queries(dialect: str) -> dict[str, str]:
    """Read ``<dialect>/queries.sql`` into ``{name: text}``."""
    blocks = load_blocks(_PACKAGE, dialect, "queries.sql")
    return {name: block.text.rstrip(";") for name, block in blocks.items()}


@dataclass(frozen=True, slots=True)
class Migration:
    """One forward-only schema step, ``NNNN_name.sql``."""

    version: int
    name: str
    statements: tuple[str, ...]


_DOLLAR_QUOTE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def split_statements(text: str) -> tuple[str, ...]:
    """Split a migration file at lines ending with ``;``, except inside a dollar-quoted
    body (``$$ … $$`` or ``$tag$ … $tag$``: a PL/pgSQL function is one statement)."""
    statements, current = [], []
    quote: str | None = None  # the dollar quote we are inside, if any
    for line in text.splitlines():
        if quote is None and (line.lstrip().startswith("--") or not line.strip()):
            continue
        current.append(line)
        for match in _DOLLAR_QUOTE.finditer(line):
            if quote is None:
                quote = match.group(0)
            elif match.group(0) == quote:
                quote = None
        if quote is None and line.rstrip().endswith(";"):
            statements.append("\n".join(current).rstrip().rstrip(";"))
            current = []
    if current:
        statements.append("\n".join(current))
    return tuple(statements)


def load_migrations(dialect: str) -> list[Migration]:
    """All migrations of ``dialect`` in version order."""
    folder = resources.files(_PACKAGE).joinpath(dialect, "migrations")
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


def load_schema(dialect: str) -> tuple[str, ...]:
    """The statements of ``<dialect>/schema.sql``."""
    return split_statements(resources.files(_PACKAGE).joinpath(dialect, "schema.sql").read_text())
