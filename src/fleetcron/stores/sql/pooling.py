"""What ``fleetcron doctor`` checks of a PostgreSQL connection: whether a pooler stands
between the store and the server, and in which mode (:meth:`PostgresStore.doctor_facts
<fleetcron.stores.sql.postgres.PostgresStore.doctor_facts>`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleetcron.doctor.findings import Finding

__all__ = ["PoolingFacts", "PoolingMode", "PoolingUnknown", "pooling_mode"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolingFacts:
    """What PostgreSQL said of the server process behind each statement, as ``(announced
    pid, pg_backend_pid())`` pairs: ``first`` on the store's connection, ``second`` on a
    second connection, the statements of the two interleaved, each its own transaction.
    ``prepares``: the store's connection prepares statements it runs often (psycopg's
    ``prepare_threshold``)."""

    first: tuple[tuple[int, int], ...]
    second: tuple[tuple[int, int], ...]
    prepares: bool = False

    def findings(self) -> list[Finding]:
        """The pooler found, and whether the driver's prepared statements survive it."""
        return _findings(self, None)


@dataclass(frozen=True, slots=True)
class PoolingUnknown:
    """The pooling probe could not run (its second connection was refused): ``error``."""

    error: str

    def findings(self) -> list[Finding]:
        return _findings(None, self.error)


PoolingMode = Literal["none", "transaction", "unknown"]


def pooling_mode(facts: PoolingFacts) -> PoolingMode:
    """``none`` when each statement ran in the process the server announced at connect
    (no pooler); ``transaction`` when server processes were shared between the two client
    connections, or one client connection moved between them (a pooler in transaction
    or statement mode); ``unknown`` for a pooler not seen to do either (session pooling,
    or a pool busy enough to hand out other server connections)."""
    pairs = facts.first + facts.second
    if all(announced == reported for announced, reported in pairs):
        return "none"
    first = {reported for _, reported in facts.first}
    second = {reported for _, reported in facts.second}
    if first & second or len(first) > 1 or len(second) > 1:
        return "transaction"
    return "unknown"


def _findings(pooling: PoolingFacts | None, error: str | None) -> list[Finding]:
    check = "postgres (pooler)"
    if error is not None:
        return [
            Finding(
                level="warn",
                check=check,
                message=f"cannot tell: {error}",
                advice="the check opens a second connection for a moment; allow one more "
                "connection to the database, or run it when the pool has room",
            )
        ]
    if pooling is None:
        return []
    mode = pooling_mode(pooling)
    works = (
        "fleetcron works behind it: every statement is its own transaction and nothing is "
        "kept in the session; tools built on session advisory locks, SET or LISTEN would not"
    )
    if mode == "transaction":
        works += " (fleetcron's lock mode 'advisory' is one: it is refused there)"
    if mode == "none":
        return [
            Finding(
                level="ok",
                check=check,
                message="none: each statement ran in the server process PostgreSQL "
                "announced at connect",
            )
        ]
    if mode == "unknown":
        return [
            Finding(
                level="ok",
                check=check,
                message="a connection pooler (PgBouncer or alike) answers, not PostgreSQL "
                "itself; it was not seen to pool per transaction (session pooling, or a "
                "busy pool)",
                advice=works,
            )
        ]
    found = (
        "transaction pooling: a pooler (PgBouncer or alike) ran statements of two client "
        "connections on one server connection"
    )
    if pooling.prepares:
        return [
            Finding(
                level="warn",
                check=check,
                message=found,
                advice=f"{works}. But its driver prepares a statement it runs often, which "
                'another server connection does not know (\'prepared statement "_pg3_0" '
                "does not exist' or 'already exists' under load): give PgBouncer 1.21 or "
                "later max_prepared_statements = 100, or add prepared_statements=off to the "
                "backend URL",
            )
        ]
    return [Finding(level="ok", check=check, message=found, advice=works)]
