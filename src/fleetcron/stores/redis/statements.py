"""The Redis store's statements: a Lua script called once, once per key set in one
pipeline, and a key scan."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetcron.stores.statements import Statement

__all__ = ["KeyScan", "Script", "ScriptArg", "ScriptCalls", "fan_out"]

ScriptArg = str | bytes | int | float
"""What a Lua script takes as an argument (redis-py encodes it)."""


@dataclass(frozen=True, slots=True)
class Script(Statement):
    """Call the named Lua script once with ``keys`` and ``args``."""

    name: str
    keys: tuple[str, ...] = ()
    args: tuple[ScriptArg, ...] = ()


@dataclass(frozen=True, slots=True)
class ScriptCalls(Statement):
    """Call the named Lua script once per ``(keys, args)`` of ``calls``, all in one
    pipeline: one round trip, each call atomic on its own."""

    name: str
    calls: tuple[tuple[tuple[str, ...], tuple[ScriptArg, ...]], ...]


@dataclass(frozen=True, slots=True)
class KeyScan(Statement):
    """Every key matching the glob ``match`` (an incremental SCAN: not a snapshot)."""

    match: str


def fan_out(name: str, keys: Iterable[str], args: tuple[ScriptArg, ...] = ()) -> ScriptCalls:
    """One call of script ``name`` per key, each with the same ``args``."""
    return ScriptCalls(name, tuple(((key,), args) for key in keys))
