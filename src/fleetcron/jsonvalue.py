"""The JSON values fleetcron stores for you (queue items, checkpoints): checked before they
reach a store, so a bad one is a clear error and nothing is written. Never pickle."""

from __future__ import annotations

import json
from typing import Any

from fleetcron.errors import ConfigurationError

__all__ = ["MAX_JSON_DEPTH", "encode_json"]

MAX_JSON_DEPTH = 100
"""The deepest lists and objects may nest in a stored value (``[[1]]`` is 2 deep): far
more than work or a mark needs, and a value every reader takes back — Python's ``json``
recurses once per level, on the stack of whoever claims or reads it."""

_CONTAINERS = (dict, list, tuple)  # what json.dumps writes as an array or an object
_KINDS = "JSON values: dict, list, str, int, float, bool, None — never pickled objects"


def encode_json(value: Any, *, where: str, limit: int, too_big: str) -> str:
    """``value`` as compact JSON text (UTF-8 as it is, not escaped); a
    :class:`ConfigurationError` naming ``where`` when it is not JSON (a set, bytes, an
    object, NaN), holds a lone surrogate, nests lists and objects deeper than
    :data:`MAX_JSON_DEPTH`, or is over ``limit`` bytes (``too_big`` says what to do
    instead)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        if _deeper_than(value, MAX_JSON_DEPTH):
            raise ConfigurationError(_too_deep(where)) from None
        raise  # the caller's own stack was nearly used up: not the value's fault
    except (TypeError, ValueError) as exc:
        reason = str(exc)
        if isinstance(exc, ValueError) and "Out of range float" in reason:
            reason = "NaN and infinities are not JSON"
        raise ConfigurationError(f"{where} cannot be stored: {reason} ({_KINDS})") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{where} holds a lone surrogate (half of a UTF-16 pair), which is not UTF-8"
        ) from None
    if size > limit:
        raise ConfigurationError(
            f"{where} is {size} bytes as JSON; the most is {limit} bytes ({too_big})"
        )
    # Each level opens a bracket: a text with few of them (most values) is not walked.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise ConfigurationError(_too_deep(where))
    return text


def _too_deep(where: str) -> str:
    return (
        f"{where} is nested too deep: lists and objects may nest at most {MAX_JSON_DEPTH} "
        "levels deep"
    )


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether lists and objects nest more than ``depth`` levels deep in ``value``: level
    by level, without recursion (the value may be deeper than the stack) and never past
    level ``depth + 1`` (so a cycle ends the walk too)."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    reached = 0
    while level:
        reached += 1
        if reached > depth:
            return True
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, _CONTAINERS)
        ]
    return False
