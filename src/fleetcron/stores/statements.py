"""What an operation asks its runner to do: a small closed set of typed statements.

An operation (:data:`~fleetcron.stores.base.Operation`) yields these and is sent back
their answers. Each runner carries out the kinds its backend speaks and refuses the rest:

==================  ===================  =================================================
statement           runner               answer
==================  ===================  =================================================
:class:`Query`      SQL (sync, async)    :class:`SqlResult` (rows and column names)
:class:`QueryBatch` SQL (sync, async)    ``list[SqlResult]``, one per parameter set
:class:`Script`     Redis                the script's reply
:class:`ScriptCalls` Redis               ``list`` of replies, one per call, in order
:class:`KeyScan`    Redis                ``list[str]`` of the matching keys
:class:`Step`       memory               what the step returns
==================  ===================  =================================================

Parameters and arguments are always bound by the driver, never interpolated into text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KeyScan",
    "Query",
    "QueryBatch",
    "Script",
    "ScriptArg",
    "ScriptCalls",
    "SqlResult",
    "Statement",
    "Step",
    "fan_out",
]


@dataclass(frozen=True, slots=True)
class Query:
    """Run the named query of the dialect's ``queries.sql`` with ``params``."""

    name: str
    params: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueryBatch:
    """Run the named query once per parameter set, all in one round trip (PostgreSQL
    pipeline, MySQL multi-statement text); each execution yields exactly one result set."""

    name: str
    batch: tuple[Mapping[str, object], ...]


ScriptArg = str | bytes | int | float
"""What a Lua script takes as an argument (redis-py encodes it)."""


@dataclass(frozen=True, slots=True)
class Script:
    """Call the named Lua script once with ``keys`` and ``args``."""

    name: str
    keys: tuple[str, ...] = ()
    args: tuple[ScriptArg, ...] = ()


@dataclass(frozen=True, slots=True)
class ScriptCalls:
    """Call the named Lua script once per ``(keys, args)`` of ``calls``, all in one
    pipeline: one round trip, each call atomic on its own."""

    name: str
    calls: tuple[tuple[tuple[str, ...], tuple[ScriptArg, ...]], ...]


@dataclass(frozen=True, slots=True)
class KeyScan:
    """Every key matching the glob ``match`` (an incremental SCAN: not a snapshot)."""

    match: str


@dataclass(frozen=True, slots=True)
class Step:
    """Apply ``fn(state, store_now_us)`` to the memory store's state, atomically."""

    fn: Callable[[Any, int], Any]


Statement = Query | QueryBatch | Script | ScriptCalls | KeyScan | Step


@dataclass(frozen=True, slots=True)
class SqlResult:
    """Rows returned by a statement (empty when it returns none), rows it matched, and the
    names of the returned columns, in the rows' order (as the driver describes the
    result). Records are read from the rows by those names (:mod:`fleetcron.stores.rows`)."""

    rows: list[tuple[Any, ...]]
    rowcount: int
    columns: tuple[str, ...] = ()


def fan_out(name: str, keys: Iterable[str], args: tuple[ScriptArg, ...] = ()) -> ScriptCalls:
    """One call of script ``name`` per key, each with the same ``args``."""
    return ScriptCalls(name, tuple(((key,), args) for key in keys))
