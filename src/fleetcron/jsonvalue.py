"""The JSON values fleetcron stores for you (queue items, checkpoints): checked before they
reach a store, so a bad one is a clear error and nothing is written. Never pickle."""

from __future__ import annotations

import json
from typing import Any

from fleetcron.errors import ConfigurationError

__all__ = ["encode_json"]

_KINDS = "JSON values: dict, list, str, int, float, bool, None — never pickled objects"


def encode_json(value: Any, *, where: str, limit: int, too_big: str) -> str:
    """``value`` as compact JSON text (UTF-8 as it is, not escaped); a
    :class:`ConfigurationError` naming ``where`` when it is not JSON (a set, bytes, an
    object, NaN), holds a lone surrogate, or is over ``limit`` bytes (``too_big`` says
    what to do instead)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
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
    return text
