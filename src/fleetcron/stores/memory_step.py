"""The in-memory store's one statement: a step applied to its state atomically."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetcron.stores.statements import Statement

__all__ = ["Step"]


@dataclass(frozen=True, slots=True)
class Step(Statement):
    """Apply ``fn(state, store_now_us)`` to the memory store's state, atomically."""

    fn: Callable[[Any, int], Any]
